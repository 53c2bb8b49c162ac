// gen_man_options.c - prints the OPTIONS section of man/llsrv.yaml.5 from the option table.
// Regenerate after changing server/service/config.c:
//   build/tests/gen_man_options > /tmp/o && (edit man/llsrv.yaml.5 between the GENERATED markers)
// test_config fails while the page and the table disagree.
#include <stdio.h>

#include "ll_config.h"

int main(void) {
  ll_config_print_man_options(stdout);
  return 0;
}
