/* A small SwiGLU-backward problem for the emulator's C tests: host data, device buffers and
 * tensors, phase 1, a synchronised launch and the docs/operator.md math to check results by. */
#ifndef ACL_SWIGLU_EMU_PROBLEM_H
#define ACL_SWIGLU_EMU_PROBLEM_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "emu_operator_params.h"
#include "emu_test.h"

#define PHASE1 "aclnnSwigluGroupQuantGradGetWorkspaceSize"
#define PHASE2 "aclnnSwigluGroupQuantGrad"
#define WS_BYTES 16384

/* ---- a problem: host data, device buffers, tensors ---- */

typedef struct {
    int64_t T, H;
    int weight;              /* weight, yOrigin and gradWeight present */
    int64_t G;               /* groupIndex elements; -1 = no groupIndex tensor */
    int64_t groups[8];
    float *gy, *x, *w, *yo;  /* host inputs */
    void *dgy, *dx, *dw, *dyo, *dgi, *dgx, *dgw;
    aclTensor *tgy, *tx, *tw, *tyo, *tgi, *tgx, *tgw;
} prob;

static __thread unsigned rng_state;   /* (per thread: several threads make problems at once) */

static inline float rnd(float lo, float hi)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)(rng_state >> 8) / 16777216.0f;
}

static inline void *dev_alloc(size_t size)
{
    void *p = NULL;
    CHECK_EQ_INT(aclrtMalloc(&p, size, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    return p;
}

static inline void upload(void *dev, const void *host, size_t n)
{
    CHECK_EQ_INT(aclrtMemcpy(dev, n, host, n, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
}

static inline void download(void *host, const void *dev, size_t n)
{
    CHECK_EQ_INT(aclrtMemcpy(host, n, dev, n, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
}

static inline void *dev_upload(const void *host, size_t n)
{
    void *d = dev_alloc(n);
    upload(d, host, n);
    return d;
}

static inline aclTensor *tensor_at(aclDataType dt, uint64_t n, const int64_t *dims, void *data)
{
    aclTensor *t = aclCreateTensor(dims, n, dt, NULL, 0, ACL_FORMAT_ND, dims, n, data);
    CHECK(t != NULL);
    return t;
}

/* ---- the problem's tensor and buffer of each operator parameter (emu_operator_params.h) ---- */

static inline aclTensor **prob_tensor_slot(prob *p, size_t slot)
{
    aclTensor **all[OP_PARAMS] = {&p->tgy, &p->tx, &p->tw, &p->tyo, &p->tgi, &p->tgx, &p->tgw};
    return all[slot];
}

static inline void **prob_buffer_slot(prob *p, size_t slot)
{
    void **all[OP_PARAMS] = {&p->dgy, &p->dx, &p->dw, &p->dyo, &p->dgi, &p->dgx, &p->dgw};
    return all[slot];
}

/* Whether p has the parameter at all (weight, yOrigin and gradWeight go together). */
static inline int prob_has_slot(const prob *p, size_t slot)
{
    if (slot == OP_PARAM_WEIGHT || slot == OP_PARAM_Y_ORIGIN || slot == OP_PARAM_GRAD_WEIGHT) {
        return p->weight;
    }
    if (slot == OP_PARAM_GROUP_INDEX) return p->G >= 0;
    return 1;
}

static inline aclDataType prob_slot_dtype(size_t slot)
{
    return slot == OP_PARAM_GROUP_INDEX ? ACL_INT64 : ACL_FLOAT;
}

/* The slot's contiguous shape in p; returns its rank. */
static inline uint64_t prob_slot_dims(const prob *p, size_t slot, int64_t dims[2])
{
    if (slot == OP_PARAM_GROUP_INDEX) {
        dims[0] = p->G;
        return 1;
    }
    dims[0] = p->T;
    if (slot == OP_PARAM_X || slot == OP_PARAM_GRAD_X) dims[1] = 2 * p->H;
    else if (slot == OP_PARAM_GRAD_Y || slot == OP_PARAM_Y_ORIGIN) dims[1] = p->H;
    else dims[1] = 1;   /* weight and gradWeight: [T, 1] */
    return 2;
}

/* Makes p's tensors (contiguous, of its shapes) on its device buffers, or with no device
 * address at all when `at_buffers` is 0. */
static inline void prob_tensors(prob *p, int at_buffers)
{
    for (size_t slot = 0; slot < OP_PARAMS; slot++) {
        if (!prob_has_slot(p, slot)) continue;
        int64_t dims[2];
        uint64_t rank = prob_slot_dims(p, slot, dims);
        *prob_tensor_slot(p, slot) = tensor_at(prob_slot_dtype(slot), rank, dims,
                                               at_buffers ? *prob_buffer_slot(p, slot) : NULL);
    }
}

/* Fills host data from `seed`, uploads it, allocates fresh (0xFF) outputs; tensors are made
 * when `tensors` is set. G >= 0 adds an INT64 groupIndex tensor holding `groups`. */
static inline void prob_init(prob *p, int64_t T, int64_t H, int weight, int64_t G, const int64_t *groups,
                      unsigned seed, int tensors)
{
    memset(p, 0, sizeof *p);
    p->T = T;
    p->H = H;
    p->weight = weight;
    p->G = G;
    rng_state = seed;
    size_t n_gy = (size_t)(T * H), n_x = 2 * n_gy;
    p->gy = malloc(n_gy * sizeof(float));
    p->x = malloc(n_x * sizeof(float));
    p->w = malloc((size_t)T * sizeof(float));
    p->yo = malloc(n_gy * sizeof(float));
    for (size_t i = 0; i < n_gy; i++) p->gy[i] = rnd(-1.0f, 1.0f);
    for (size_t i = 0; i < n_x; i++) p->x[i] = rnd(-4.0f, 4.0f);
    for (int64_t i = 0; i < T; i++) p->w[i] = rnd(0.5f, 1.5f);
    for (size_t i = 0; i < n_gy; i++) p->yo[i] = rnd(-1.0f, 1.0f);
    p->dgy = dev_upload(p->gy, n_gy * sizeof(float));
    p->dx = dev_upload(p->x, n_x * sizeof(float));
    p->dgx = dev_alloc(n_x * sizeof(float));
    if (weight) {
        p->dw = dev_upload(p->w, (size_t)T * sizeof(float));
        p->dyo = dev_upload(p->yo, n_gy * sizeof(float));
        p->dgw = dev_alloc((size_t)T * sizeof(float));
    }
    if (G >= 0) {
        for (int64_t g = 0; g < G; g++) p->groups[g] = groups[g];
        p->dgi = dev_upload(p->groups, (size_t)(G > 0 ? G : 1) * sizeof(int64_t));
    }
    if (tensors) prob_tensors(p, 1);
}

static inline void free_dev(void **d)
{
    if (*d != NULL) CHECK_EQ_INT(aclrtFree(*d), ACL_SUCCESS);
    *d = NULL;
}

static inline void free_tensor(aclTensor **t)
{
    if (*t != NULL) CHECK_EQ_INT(aclDestroyTensor(*t), ACLNN_SUCCESS);
    *t = NULL;
}

static inline void prob_free(prob *p)
{
    free(p->gy);
    free(p->x);
    free(p->w);
    free(p->yo);
    for (size_t slot = 0; slot < OP_PARAMS; slot++) free_dev(prob_buffer_slot(p, slot));
    for (size_t slot = 0; slot < OP_PARAMS; slot++) free_tensor(prob_tensor_slot(p, slot));
}

static inline int phase1(const prob *p, double clamp, uint64_t *ws, aclOpExecutor **ex)
{
    *ex = NULL;
    *ws = 0;
    return aclnnSwigluGroupQuantGradGetWorkspaceSize(p->tgy, p->tx, p->tw, p->tyo, p->tgi, clamp,
                                                     p->tgx, p->tgw, ws, ex);
}

/* Points every tensor of a repeatable executor, made at phase 1 from `handles`' tensors, at
 * `buffers`' device memory (a problem of the same shapes). */
static inline void prob_rebind(aclOpExecutor *ex, prob *handles, prob *buffers)
{
    for (size_t slot = 0; slot < OP_PARAMS; slot++) {
        aclTensor *t = *prob_tensor_slot(handles, slot);
        if (t == NULL) continue;
        void *data = *prob_buffer_slot(buffers, slot);
        if (slot < OP_INPUTS) {
            CHECK_EQ_INT(aclSetInputTensorAddr(ex, slot, t, data), ACLNN_SUCCESS);
        } else {
            CHECK_EQ_INT(aclSetOutputTensorAddr(ex, slot - OP_INPUTS, t, data), ACLNN_SUCCESS);
        }
    }
}

/* Phase 1 that must succeed with a 16 KiB workspace request. */
static inline aclOpExecutor *phase1_ok(const prob *p, double clamp)
{
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    int rc = phase1(p, clamp, &ws, &ex);
    CHECK_EQ_INT(rc, ACLNN_SUCCESS);
    if (rc != ACLNN_SUCCESS) {
        const char *m = aclGetRecentErrMsg();
        fprintf(stderr, "  phase 1: %s\n", m ? m : "(no message)");
    }
    CHECK_EQ_INT(ws, WS_BYTES);
    return ex;
}

/* ---- the expected result (docs/operator.md, in double) ---- */

static inline int64_t expected_trunc(const int64_t *groups, int64_t G, int64_t T)
{
    if (G < 0) return T;
    uint32_t sum = 0;
    for (int64_t g = 0; g < G; g++) sum += (uint32_t)groups[g];
    return (int64_t)sum < T ? (int64_t)sum : T;
}

/* Compares gradX (and gradWeight) read from `dgx`/`dgw` with the math on p's host inputs;
 * rows >= trunc must be +0.0. clamp_on with limit c. Returns the number of bad elements. */
static inline int64_t verify_into(const prob *p, const void *dgx, const void *dgw, int64_t trunc,
                           int clamp_on, double clamp)
{
    int64_t T = p->T, H = p->H, bad = 0;
    float *gx = malloc((size_t)(T * 2 * H) * sizeof(float));
    float *gw = malloc((size_t)T * sizeof(float));
    download(gx, dgx, (size_t)(T * 2 * H) * sizeof(float));
    if (p->weight) download(gw, dgw, (size_t)T * sizeof(float));
    double c = (double)(float)clamp;
    for (int64_t t = 0; t < T; t++) {
        double gw_sum = 0.0;
        for (int64_t h = 0; h < H; h++) {
            double gy = p->gy[t * H + h];
            double x0o = p->x[t * 2 * H + h], x1o = p->x[t * 2 * H + H + h];
            double e0 = 0.0, e1 = 0.0;
            if (t < trunc) {
                if (p->weight) {
                    gw_sum += gy * p->yo[t * H + h];
                    gy *= p->w[t];
                }
                double x0 = x0o, x1 = x1o;
                if (clamp_on) {
                    x0 = fmin(x0, c);
                    x1 = fmin(fmax(x1, -c), c);
                }
                double s = 1.0 / (1.0 + exp(-x0));
                double silu = x0 * s, dsilu = s * (1.0 + x0 * (1.0 - s));
                e0 = gy * x1 * dsilu;
                e1 = gy * silu;
                if (clamp_on) {
                    e0 *= x0o < c ? 1.0 : 0.0;
                    e1 *= (-c < x1o && x1o < c) ? 1.0 : 0.0;
                }
            }
            float a0 = gx[t * 2 * H + h], a1 = gx[t * 2 * H + H + h];
            int ok0, ok1;
            if (t < trunc) {
                ok0 = fabs(a0 - e0) <= 1e-5 + 1e-5 * fabs(e0);
                ok1 = fabs(a1 - e1) <= 1e-5 + 1e-5 * fabs(e1);
            } else {
                ok0 = a0 == 0.0f && !signbit(a0);
                ok1 = a1 == 0.0f && !signbit(a1);
            }
            if (!ok0 || !ok1) {
                if (bad < 5) {
                    fprintf(stderr, "  gradX[%lld, %lld]: got %.9g / %.9g, expected %.9g / %.9g\n",
                            (long long)t, (long long)h, a0, a1, e0, e1);
                }
                bad += !ok0 + !ok1;
            }
        }
        if (p->weight) {
            int ok = t < trunc ? fabs(gw[t] - gw_sum) <= 1e-5 + 1e-5 * fabs(gw_sum)
                               : gw[t] == 0.0f && !signbit(gw[t]);
            if (!ok) {
                if (bad < 5) {
                    fprintf(stderr, "  gradWeight[%lld]: got %.9g, expected %.9g\n", (long long)t,
                            gw[t], t < trunc ? gw_sum : 0.0);
                }
                bad++;
            }
        }
    }
    free(gx);
    free(gw);
    return bad;
}

static inline int64_t verify(const prob *p, int64_t trunc, int clamp_on, double clamp)
{
    return verify_into(p, p->dgx, p->dgw, trunc, clamp_on, clamp);
}

/* Every byte of device memory [dev, dev + n) still holds aclrtMalloc's 0xFF fill. */
static inline int all_ff(const void *dev, size_t n)
{
    unsigned char *h = malloc(n);
    download(h, dev, n);
    int same = 1;
    for (size_t i = 0; i < n; i++) same &= h[i] == 0xFF;
    free(h);
    return same;
}

/* Launches a phase-1 executor with a fresh workspace on `stream` and synchronises. */
static inline void launch_sync(aclOpExecutor *ex, aclrtStream stream)
{
    void *ws = dev_alloc(WS_BYTES);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(stream), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
}

#endif
