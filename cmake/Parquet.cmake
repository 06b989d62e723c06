# Compression libraries of the Parquet reader/writer (src/io/parquet_*.cc), from Debian's
# libsnappy-dev, libzstd-dev, zlib1g-dev (GZIP), liblz4-dev (LZ4_RAW and legacy LZ4) and
# libbrotli-dev (BROTLI; its encoder for tests/io, which build BROTLI pages). Sets
# DLREC_PARQUET_LIBS (linked into dlrec_io).
find_path(DLREC_SNAPPY_INCLUDE snappy-c.h REQUIRED)
find_library(DLREC_SNAPPY_LIB NAMES snappy REQUIRED)
find_path(DLREC_ZSTD_INCLUDE zstd.h REQUIRED)
find_library(DLREC_ZSTD_LIB NAMES zstd REQUIRED)
find_path(DLREC_ZLIB_INCLUDE zlib.h REQUIRED)
find_library(DLREC_ZLIB_LIB NAMES z REQUIRED)
find_path(DLREC_LZ4_INCLUDE lz4.h REQUIRED)
find_library(DLREC_LZ4_LIB NAMES lz4 REQUIRED)
find_path(DLREC_BROTLI_INCLUDE brotli/decode.h REQUIRED)
find_library(DLREC_BROTLIDEC_LIB NAMES brotlidec REQUIRED)
find_library(DLREC_BROTLIENC_LIB NAMES brotlienc REQUIRED)
add_library(dlrec_parquet_codecs INTERFACE)
target_link_libraries(dlrec_parquet_codecs INTERFACE ${DLREC_SNAPPY_LIB} ${DLREC_ZSTD_LIB}
                      ${DLREC_ZLIB_LIB} ${DLREC_LZ4_LIB} ${DLREC_BROTLIDEC_LIB}
                      ${DLREC_BROTLIENC_LIB})
target_include_directories(dlrec_parquet_codecs INTERFACE ${DLREC_SNAPPY_INCLUDE}
                           ${DLREC_ZSTD_INCLUDE} ${DLREC_ZLIB_INCLUDE} ${DLREC_LZ4_INCLUDE}
                           ${DLREC_BROTLI_INCLUDE})
set(DLREC_PARQUET_LIBS dlrec_parquet_codecs)
