# The server: protocol grammar and chat templates (unit), then the real thing over sockets.
ll_test(NAME test_proto SOURCES test_proto.c LIBS ll_server LABELS unit)
