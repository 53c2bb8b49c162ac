# lltop (tui/): in tmux against a real llsrv (configs/demo.yaml) and against fake monitor
# servers (hostile lines; a training run): panels, keys, control commands, reconnect, resize,
# NO_COLOR / C locale, terminal restored on q and on SIGTERM/SIGINT/SIGHUP; --once/--json.
# The parser's fuzz target is tests/fuzz/fuzz_monitor.c.
ll_script_test(NAME lltop_tmux COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_lltop.py
  LABELS integration TIMEOUT 300)
