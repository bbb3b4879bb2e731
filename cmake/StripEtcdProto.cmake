# cmake -DIN=<etcd .proto> -DOUT=<copy> -P StripEtcdProto.cmake
# Copies one of etcd's .proto files (Debian: golang-etcd-server-dev) without what only Go's
# generators read: gogoproto's imports and options, and the HTTP gateway's annotations. The
# messages and services are untouched, so the C++ client speaks etcd's wire format as is. Fails,
# naming the file, if anything of either remains (a new etcd version with options not seen here).
file(READ "${IN}" text)
string(REGEX REPLACE "import \"gogoproto/[^\"]*\";\n" "" text "${text}")
string(REGEX REPLACE "import \"google/api/[^\"]*\";\n" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;\n" "" text "${text}")
# The gateway's bindings nest one level ("additional_bindings { ... }").
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {([^{}]|{[^{}]*})*};" "" text "${text}")
string(REGEX REPLACE " *\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
string(REGEX MATCH "gogoproto|google\\.api|google/api" left "${text}")
if(left)
  message(FATAL_ERROR "StripEtcdProto.cmake: ${IN} still mentions '${left}' after stripping: "
                      "this etcd version's .proto files need another rule here")
endif()
# The lite runtime, as crun's own protocol: nothing of etcd's API is registered (and parsed)
# at every start of crun, and no reflection is linked in.
string(REGEX REPLACE "\npackage ([a-z.]+);\n" "\npackage \\1;\noption optimize_for = LITE_RUNTIME;\n"
       text "${text}")
if(NOT text MATCHES "option optimize_for = LITE_RUNTIME;")
  message(FATAL_ERROR "StripEtcdProto.cmake: ${IN} has no package line to put the lite option after")
endif()
file(WRITE "${OUT}" "${text}")
