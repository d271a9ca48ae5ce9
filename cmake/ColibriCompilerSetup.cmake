# Warnings, ccache and sanitizers for every target in the tree.
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_C_COMPILER_LAUNCHER "${CCACHE_PROGRAM}")
  set(CMAKE_CXX_COMPILER_LAUNCHER "${CCACHE_PROGRAM}")
  set(CMAKE_CUDA_COMPILER_LAUNCHER "${CCACHE_PROGRAM}")
endif()

add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-Wall;-Wextra>")
# GCC 12 reports -Wrestrict false positives inside libstdc++ for `"literal" + std::string` at -O2/-O3
# (GCC bug 105651, fixed in GCC 13); the warning is kept for other compilers.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>")
endif()
if(COLIBRI_WERROR)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-Werror>")
endif()

if(COLIBRI_SANITIZE)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=address,undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=undefined>")
  add_link_options(-fsanitize=address,undefined)
  # Line tables only, and -O1 (ASan's advice), both after RelWithDebInfo's -g -O2 so they win: reports keep function,
  # file and line. A cold build of the unit tests takes 568 s instead of 942 (http_server.cpp 72 s instead of 115) and
  # their run 237 s instead of 180: 5 minutes less of CI's ASan job, most of which is that build.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-g1;-O1>")
endif()

# Data races in the threaded parts (expert reads and prefetch, the server's scheduler and connections, the CPU
# backend's workers). ASan and TSan cannot share a process.
if(COLIBRI_TSAN)
  if(COLIBRI_SANITIZE)
    message(FATAL_ERROR "COLIBRI_TSAN and COLIBRI_SANITIZE cannot be combined (ThreadSanitizer excludes AddressSanitizer)")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=thread;-fno-omit-frame-pointer;-g1>")
  # GCC 12+ warns (-Wtsan, an error under -Werror) at every atomic_thread_fence, which TSan does not model: Boost.Asio
  # has one around each handler it runs. Its handlers are handed over under the scheduler's mutex, which TSan sees.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12)
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-Wno-tsan>")
  endif()
  add_link_options(-fsanitize=thread)
endif()

# libFuzzer: every object is instrumented for coverage, with ASan and UBSan; the fuzz targets link the fuzzer's main.
if(COLIBRI_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "COLIBRI_FUZZ needs clang (libFuzzer): configure with the 'fuzz' preset, or set "
                        "CMAKE_C_COMPILER=clang and CMAKE_CXX_COMPILER=clang++")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer;-g1>")
  add_link_options(-fsanitize=address,undefined)
endif()
