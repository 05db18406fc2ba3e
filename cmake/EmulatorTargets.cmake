# Compile settings shared by the emulator's libraries, its tests and the benchmark drivers.
find_package(Threads REQUIRED)

# Bit-exact fp32 arithmetic: no contraction into FMA, no fast-math reassociation.
# -fno-trapping-math only lets the compiler if-convert and vectorise (no value changes): the
# kernel never reads floating-point exception flags.
set(EMU_C_FLAGS -ffp-contract=off -fno-fast-math -fno-trapping-math -fvisibility=hidden -Wall -Wextra
                -Wno-unused-parameter -Wno-psabi)
set(EMU_OPT_FLAGS $<$<CONFIG:Release>:-O3>)
if(ACL_SWIGLU_SANITIZE)
  set(EMU_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
                         -fno-omit-frame-pointer)
elseif(ACL_SWIGLU_TSAN)
  set(EMU_SANITIZE_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
endif()

function(emu_target_setup target)
  set_target_properties(${target} PROPERTIES
    C_STANDARD 11
    C_STANDARD_REQUIRED ON
    C_EXTENSIONS ON
    POSITION_INDEPENDENT_CODE ON)
  target_include_directories(${target} PRIVATE "${EMU_INCLUDE_DIR}" "${EMU_SOURCE_DIR}")
  target_compile_options(${target} PRIVATE ${EMU_C_FLAGS} ${EMU_OPT_FLAGS} ${EMU_SANITIZE_FLAGS})
  target_link_options(${target} PRIVATE ${EMU_SANITIZE_FLAGS})
endfunction()

function(emu_library target output_name)
  emu_target_setup(${target})
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME ${output_name}
    LIBRARY_OUTPUT_DIRECTORY "${ACL_SWIGLU_EMULATOR_ROOT}/lib64"
    BUILD_RPATH "$ORIGIN"
    INSTALL_RPATH "$ORIGIN"
    BUILD_WITH_INSTALL_RPATH OFF)
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
endfunction()

