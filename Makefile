# Thin wrapper over CMake; see README.md.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all configure build demo test bench clean

all: build

configure:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	$(BUILD)/bin/dlrec demo

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

bench: build
	bash bench/criteo_sample.sh

clean:
	rm -rf $(BUILD)
