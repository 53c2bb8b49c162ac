# Thin wrapper over CMake for people who type make. The README's two commands are
# ./setup.sh run and ./setup.sh test (they also install dependencies).
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

all:
	cmake -S . -B $(BUILD) -DLL_WERROR=ON && cmake --build $(BUILD) -j$(JOBS)
test: all
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)
# Speed of the default model (pp128 / tg64, 1 and 2 threads), as llama-bench reports it.
bench: all
	@m=$$(bash tests/fetch-smollm2.sh) && for t in 1 2; do ./$(BUILD)/server/llsrv bench --model "$$m" -p 128 -n 64 -t $$t -r 3; done
# Serving throughput through real sockets: 8 concurrent greedy streams vs 1 (aggregate tok/s).
bench-serve: all
	@m=$$(bash tests/fetch-smollm2.sh) && LL_BINARY_DIR=$(BUILD) python3 tests/bench/bench_server.py "$$m" --streams 8 --tokens 64
# The HTTP API against the line protocol: 8 streams each, same server (tok/s, time to first token).
bench-http: all
	@m=$$(bash tests/fetch-smollm2.sh) && LL_BINARY_DIR=$(BUILD) python3 tests/bench/bench_http.py "$$m" --streams 8 --tokens 64

# What watching costs: lltop's CPU, the server's monitor cost with 8 lltop attached (2.5 min).
bench-lltop: all
	@LL_BINARY_DIR=$(BUILD) python3 tests/bench/bench_lltop.py --seconds 30 --clients 8
install: all
	cmake --install $(BUILD)
clean:
	rm -rf $(BUILD) build-asan build-fuzz
.PHONY: all test bench bench-serve bench-http bench-lltop install clean
