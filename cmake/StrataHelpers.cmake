# strata_cc_library(NAME name SRCS ... [DEPS ...] [PRIVATE_DEPS ...])
# strata_cc_test(NAME name SRCS ... [DEPS ...])
#
# Warnings are on for our code only; third-party headers come in as SYSTEM.
set(STRATA_WARNING_FLAGS -Wall -Wextra)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  list(APPEND STRATA_WARNING_FLAGS -Wthread-safety)
endif()
if(STRATA_WERROR)
  list(APPEND STRATA_WARNING_FLAGS -Werror)
endif()

function(strata_apply_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${STRATA_WARNING_FLAGS}>)
endfunction()

# Every library sees its own folder and, through PUBLIC links, the folders of
# the libraries it depends on -- nothing else. Each library gets an include root
# in the build tree holding one link to its own source folder, so `#include
# "tiers/tier.h"` from swap/ fails to compile: the dependency direction is
# enforced by the compiler, not by review.
function(strata_expose_folder target)
  file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  set(root ${CMAKE_BINARY_DIR}/include_roots/${target})
  get_filename_component(parent ${root}/${folder} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  if(NOT EXISTS ${root}/${folder})
    file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${root}/${folder} SYMBOLIC)
  endif()
  target_include_directories(${target} PUBLIC ${root})
endfunction()

function(strata_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${ARG_NAME} STATIC ${ARG_SRCS})
  strata_expose_folder(${ARG_NAME})
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  strata_apply_warnings(${ARG_NAME})
endfunction()

function(strata_cc_test)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  if(NOT STRATA_BUILD_TESTS)
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  strata_expose_folder(${ARG_NAME})
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  strata_apply_warnings(${ARG_NAME})
  gtest_discover_tests(${ARG_NAME} DISCOVERY_MODE PRE_TEST
                       PROPERTIES ENVIRONMENT "STRATA_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()

# strata_cc_binary(NAME name SRCS ... [DEPS ...]): lands in build/bin.
function(strata_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  strata_expose_folder(${ARG_NAME})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  strata_apply_warnings(${ARG_NAME})
endfunction()
