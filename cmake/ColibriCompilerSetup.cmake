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
  # Line tables only (after RelWithDebInfo's -g, so it wins): reports keep function, file and line; compiling takes
  # about 30% less time (engine.cpp: 47 s instead of 68), which is most of CI's ASan job.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-g1>")
endif()
