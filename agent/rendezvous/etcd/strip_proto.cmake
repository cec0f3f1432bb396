# cmake -P strip_proto.cmake IN=<etcd .proto> OUT=<copy>
# Copies one of etcd 3.4's .proto files without what protoc cannot resolve
# here: the gogoproto options and imports (Go code generation only) and the
# google.api.http annotations (the JSON gateway). Messages, fields and
# services stay as they are, so the wire format is etcd's; the copy asks
# for protobuf-lite code (optimize_for = LITE_RUNTIME).
file(READ "${IN}" text)
string(REGEX REPLACE "import \"gogoproto/gogo.proto\";" "" text "${text}")
string(REGEX REPLACE "import \"google/api/annotations.proto\";" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;" "" text "${text}")
# (an http option may nest one level of braces: additional_bindings)
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {([^{}]|{[^{}]*})*};" "" text "${text}")
string(REGEX REPLACE "\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api")
  message(FATAL_ERROR "${IN}: gogoproto or google.api left after stripping")
endif()
# protobuf-lite's code: no descriptors, reflection or text format, which
# the client never uses and the full runtime builds at every start.
string(REGEX REPLACE "(\npackage [a-z]+;)" "\\1\noption optimize_for = LITE_RUNTIME;"
  text "${text}")
if(NOT text MATCHES "option optimize_for = LITE_RUNTIME;")
  message(FATAL_ERROR "${IN}: no package line to put optimize_for after")
endif()
file(WRITE "${OUT}.tmp" "${text}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
