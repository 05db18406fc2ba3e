# Compile settings shared by the emulator's libraries, its tests and the benchmark drivers.
find_package(Threads REQUIRED)

# Bit-exact fp32 arithmetic: no contraction into FMA, no fast-math reassociation.
# -fno-trapping-math only lets the compiler if-convert and vectorise (no value changes): the
# kernel never reads floating-point exception flags.
set(EMU_C_FLAGS -ffp-contract=off -fno-fast-math -fno-trapping-math -fvisibility=hidden -Wall -Wextra
                -Wno-unused-parameter -Wno-psabi)
set(EMU_OPT_FLAGS $<$<CONFIG:Release>:-O3>)

# EMU_EXTRA_BITS_LEVELS: ACL_SWIGLU_BITS_OPT_LEVELS less the level the build type compiles at (with
# the flags above; none is dropped for a build type of another name). -Ofast is refused: it turns
# fast-math on, which no level may.
set(EMU_EXTRA_BITS_LEVELS)
set(EMU_LEVEL_OF_Debug O0)
set(EMU_LEVEL_OF_RelWithDebInfo O2)
set(EMU_LEVEL_OF_Release O3)
set(EMU_LEVEL_OF_MinSizeRel Os)
foreach(level IN LISTS ACL_SWIGLU_BITS_OPT_LEVELS)
  if(NOT level MATCHES "^O([0-3]|s|g|z)$")
    message(FATAL_ERROR "ACL_SWIGLU_BITS_OPT_LEVELS: \"${level}\" is not one of O0 O1 O2 O3 Os Og Oz "
                        "(a level without its dash)")
  endif()
  if(NOT level STREQUAL "${EMU_LEVEL_OF_${CMAKE_BUILD_TYPE}}" AND NOT level IN_LIST EMU_EXTRA_BITS_LEVELS)
    list(APPEND EMU_EXTRA_BITS_LEVELS ${level})
  endif()
endforeach()
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

