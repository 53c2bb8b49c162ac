# Thin wrapper over CMake for people who type make. The README's two commands are
# ./setup.sh run and ./setup.sh test (they also install dependencies).
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

all:
	cmake -S . -B $(BUILD) -DLL_WERROR=ON && cmake --build $(BUILD) -j$(JOBS)
test: all
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)
bench: all
	cmake --build $(BUILD) --target bench_kernels -j$(JOBS)
install: all
	cmake --install $(BUILD)
clean:
	rm -rf $(BUILD) build-asan build-fuzz
.PHONY: all test bench install clean
