# The two targets crun's own libraries link for their heavy dependencies:
#   crun_grpc    gRPC C++ and Protobuf (with abseil, OpenSSL, c-ares, re2, upb, zlib)
#   crun_spdlog  spdlog and fmt
#   crun_openssl OpenSSL (the metrics endpoint's TLS; gRPC has its own copy of it linked in)
# With CRUN_STATIC_DEPS (the default) both come from Debian's static archives and headers, so
# that the `crun` executable needs no shared library but the C runtime (docs/install.md): a
# dynamic loader resolving ~60 libraries cost 10-15 ms on every start. Without it, Debian's
# shared libraries (faster links while developing).
add_library(crun_grpc INTERFACE)
add_library(crun_spdlog INTERFACE)
add_library(crun_openssl INTERFACE)

if(NOT CRUN_STATIC_DEPS)
  find_package(OpenSSL REQUIRED)
  target_link_libraries(crun_grpc INTERFACE protobuf::libprotobuf gRPC::grpc++)
  target_link_libraries(crun_spdlog INTERFACE spdlog::spdlog)
  target_link_libraries(crun_openssl INTERFACE OpenSSL::SSL)
  return()
endif()

# gRPC's pkg-config file lists, in link order, every archive it needs (abseil's forty
# included); those that are not system libraries must be there as lib<name>.a.
find_package(PkgConfig REQUIRED)
pkg_check_modules(CRUN_GRPC_PC REQUIRED grpc++ protobuf)
set(archives)
set(system_libs)
foreach(name IN LISTS CRUN_GRPC_PC_STATIC_LIBRARIES)
  if(name MATCHES "^(dl|m|rt|pthread|atomic)$")
    list(APPEND system_libs ${name})
    continue()
  endif()
  find_library(CRUN_ARCHIVE_${name} NAMES lib${name}.a HINTS ${CRUN_GRPC_PC_STATIC_LIBRARY_DIRS})
  if(NOT CRUN_ARCHIVE_${name})
    message(FATAL_ERROR "CRUN_STATIC_DEPS: lib${name}.a not found (gRPC's static build needs "
                        "it); install Debian's -dev package that has it, or configure with "
                        "-DCRUN_STATIC_DEPS=OFF")
  endif()
  list(APPEND archives ${CRUN_ARCHIVE_${name}})
endforeach()
list(REMOVE_DUPLICATES archives)
list(REMOVE_DUPLICATES system_libs)
# The archives refer to each other in cycles (abseil): the linker rescans them as a group.
list(JOIN archives "," archive_group)
target_link_libraries(crun_grpc INTERFACE "$<LINK_GROUP:RESCAN,${archive_group}>"
                                          Threads::Threads ${system_libs})
# The same libssl.a and libcrypto.a gRPC links (one copy in the binary).
foreach(name ssl crypto)
  if(NOT CRUN_ARCHIVE_${name})
    find_library(CRUN_ARCHIVE_${name} NAMES lib${name}.a REQUIRED)
  endif()
endforeach()
target_link_libraries(crun_openssl INTERFACE ${CRUN_ARCHIVE_ssl} ${CRUN_ARCHIVE_crypto}
                                             Threads::Threads dl)
# spdlog's implementation compiled once (cmake/spdlog_compiled.cc: in header-only mode, each of
# the files that log compiled it again, about half of their time) over header-only fmt: no
# libspdlog.so or libfmt.so at run time.
add_library(crun_spdlog_compiled STATIC ${CMAKE_CURRENT_LIST_DIR}/spdlog_compiled.cc)
target_compile_definitions(crun_spdlog_compiled
  PUBLIC SPDLOG_COMPILED_LIB SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY=1)
set_target_properties(crun_spdlog_compiled PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(crun_spdlog_compiled PUBLIC Threads::Threads)
target_link_libraries(crun_spdlog INTERFACE crun_spdlog_compiled)
