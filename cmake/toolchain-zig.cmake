# Cross toolchain for release wheels: zig's bundled clang and glibc stubs, which link against an
# older glibc than the build machine's (the manylinux floor) and cross-compile to other
# architectures. tools/build_wheels.sh sets the environment:
#   ACL_SWIGLU_ZIG_TARGET  zig target with glibc version, e.g. x86_64-linux-gnu.2.28
#   ACL_SWIGLU_ZIG         the zig executable (default: zig on PATH)
set(_acl_swiglu_zig_target "$ENV{ACL_SWIGLU_ZIG_TARGET}")
if(NOT _acl_swiglu_zig_target MATCHES "^(x86_64|aarch64)-linux-gnu\\.[0-9]+\\.[0-9]+$")
  message(FATAL_ERROR "ACL_SWIGLU_ZIG_TARGET must be <x86_64|aarch64>-linux-gnu.<glibc version>, "
                      "e.g. aarch64-linux-gnu.2.28; it is '${_acl_swiglu_zig_target}'")
endif()

set(CMAKE_SYSTEM_NAME Linux)
string(REGEX MATCH "^[^-]+" CMAKE_SYSTEM_PROCESSOR "${_acl_swiglu_zig_target}")
set(CMAKE_C_COMPILER "${CMAKE_CURRENT_LIST_DIR}/../tools/zig-cc")
set(CMAKE_CXX_COMPILER "${CMAKE_CURRENT_LIST_DIR}/../tools/zig-c++")

# Nothing from the build machine's own libraries or headers.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# clang spellings of the GCC builtins the emulator uses.
set(CMAKE_C_FLAGS_INIT "-include ${CMAKE_CURRENT_LIST_DIR}/clang_gnu_builtins.h")
