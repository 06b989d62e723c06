# Compression libraries of the Parquet reader/writer (src/io/parquet_*.cc), from Debian's
# libsnappy-dev and libzstd-dev. Sets DLREC_PARQUET_LIBS (linked into dlrec_io).
find_path(DLREC_SNAPPY_INCLUDE snappy-c.h REQUIRED)
find_library(DLREC_SNAPPY_LIB NAMES snappy REQUIRED)
find_path(DLREC_ZSTD_INCLUDE zstd.h REQUIRED)
find_library(DLREC_ZSTD_LIB NAMES zstd REQUIRED)
add_library(dlrec_parquet_codecs INTERFACE)
target_link_libraries(dlrec_parquet_codecs INTERFACE ${DLREC_SNAPPY_LIB} ${DLREC_ZSTD_LIB})
target_include_directories(dlrec_parquet_codecs INTERFACE ${DLREC_SNAPPY_INCLUDE}
                           ${DLREC_ZSTD_INCLUDE})
set(DLREC_PARQUET_LIBS dlrec_parquet_codecs)
