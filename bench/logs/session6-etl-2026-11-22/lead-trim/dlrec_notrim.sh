#!/bin/bash
GLIBC_TUNABLES=glibc.malloc.trim_threshold=4294967296 exec "$(dirname "$0")/bin/dlrec_cpu" "$@"
