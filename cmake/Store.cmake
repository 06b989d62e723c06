# The tiered embedding store's libraries (src/store, docs/SERVING.md "Tiered embedding store"),
# from Debian's packages (scripts/install-deps.sh): librocksdb-dev (the persistent tier) and
# libhiredis-dev (the Redis tier).
# Sets DLREC_WITH_ROCKSDB and DLREC_STORE_LIBS. Without the library the tier is left out: the
# store then refuses a config naming it (a clear error) and its tests skip visibly.
set(DLREC_WITH_ROCKSDB OFF)
set(DLREC_STORE_LIBS "")
find_path(DLREC_ROCKSDB_INCLUDE rocksdb/db.h)
find_library(DLREC_ROCKSDB_LIB rocksdb)
if(DLREC_ROCKSDB_INCLUDE AND DLREC_ROCKSDB_LIB)
  set(DLREC_WITH_ROCKSDB ON)
  list(APPEND DLREC_STORE_LIBS ${DLREC_ROCKSDB_LIB})
  message(STATUS "dlrec store: RocksDB tier on (${DLREC_ROCKSDB_LIB})")
else()
  message(STATUS "dlrec store: RocksDB tier not built; missing librocksdb-dev "
                 "(scripts/install-deps.sh installs it)")
endif()

# libhiredis-dev (hiredis 0.14): the Redis tier. Sets DLREC_WITH_REDIS.
set(DLREC_WITH_REDIS OFF)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(DLREC_HIREDIS QUIET IMPORTED_TARGET hiredis)
endif()
if(DLREC_HIREDIS_FOUND)
  set(DLREC_WITH_REDIS ON)
  list(APPEND DLREC_STORE_LIBS PkgConfig::DLREC_HIREDIS)
  message(STATUS "dlrec store: Redis tier on (hiredis ${DLREC_HIREDIS_VERSION})")
else()
  message(STATUS "dlrec store: Redis tier not built; missing libhiredis-dev "
                 "(scripts/install-deps.sh installs it)")
endif()
