# cmake --install: binaries (llsrv, lltop), man pages (llsrv.1, lltop.1, llsrv.yaml.5, llsrv-ckpt.5, llsrv-protocol.7), configs.
ll_script_test(NAME install COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_install.sh
  LABELS integration TIMEOUT 60)
