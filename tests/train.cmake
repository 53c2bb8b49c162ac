# The trainer: whole-model gradients against finite differences (LoRA and full), recomputation,
# loss falling on a tiny corpus, resume equal to the uninterrupted run, NaN skip, bad parameters.
ll_test(NAME test_trainer SOURCES test_trainer.c LIBS ll_server LABELS unit TIMEOUT 120)
# llsrv init / llsrv train from the command line (progress, checkpoints, SIGTERM + resume, LoRA, dry run, bad options).
ll_script_test(NAME train_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_train_cli.sh LABELS integration TIMEOUT 180)
# Training in the server: monitor fields, history and events, requests served meanwhile, train
# pause/resume/stop/save, SIGTERM checkpoint and resume, kill -9 restart.
ll_script_test(NAME server_train COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_server_train.py LABELS integration TIMEOUT 300)
# A full disk during a checkpoint (an injected EFBIG) and the data vanishing mid-run: clear
# errors, requests answered, last.ckpt intact, training goes on once the fault is gone.
ll_script_test(NAME server_train_faults COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_server_train_faults.py LABELS integration TIMEOUT 300)
# Issue 11's acceptance run on SmolLM2 Q4_1: the server fine-tunes LoRA on man/ + docs/ while it
# answers GEN requests, the validation loss falls by 20% within 200 steps on the monitor stream,
# kill -9 + restart resumes on the same curve, the exported adapter gives llama.cpp's greedy ids.
ll_script_test(NAME finetune_smollm2 COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_finetune_smollm2.py
  LABELS "integration;slow" TIMEOUT 1500 FIXTURES smollm2)
# LoRA on attention through a mixture of experts (router and experts frozen): `llsrv init --arch
# moe`, 30 steps lower the validation loss, FFN targets refused, the adapter serves; then full-
# parameter training (experts, router, load-balancing loss) lowers it and serves (~20 s).
ll_script_test(NAME moe_train COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_moe_train.sh
  LABELS integration TIMEOUT 300)
# Data-parallel training over MPI (issue 33): 1/2/4 ranks against one process (bit for bit for
# LoRA on the CPU, 1e-6 otherwise), the demo model and stories260K (its weights through
# train_world_probe; its shape through llsrv train on PoCL), a killed rank, restart with another
# rank count, SIGTERM. Without MPI in the build: `--world mpi` says MPI is not built in.
if(MPI_C_FOUND AND MPIEXEC_EXECUTABLE)
  add_executable(train_world_probe train_world_probe.c)
  target_link_libraries(train_world_probe PRIVATE ll_server)
  # Benchmark (not run by the suite): the gradient sum's cost per order (docs/PERFORMANCE.md).
  add_executable(allreduce_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/allreduce_bench.c)
  target_link_libraries(allreduce_bench PRIVATE ll_server)
  ll_script_test(NAME train_mpi COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_train_mpi.sh LABELS "integration;slow" TIMEOUT 600)
else()
  ll_script_test(NAME train_no_mpi COMMAND bash -c
    "$<TARGET_FILE:llsrv> train --world mpi --model x --data x -o x 2>&1 | grep -q 'MPI is not built in'"
    LABELS unit TIMEOUT 30)
endif()
