// murmur3_32 / hash_buckets for 4- and 8-byte integer keys (raw hash or bucket id).
#include "murmur3.cuh"

extern "C" __global__ void fl_murmur3_hash_u32(const unsigned int* values, long long n,
                                               unsigned int seed, unsigned int* out) {
    FL_FOR_EACH_INDEX(i, n) { out[i] = fl_murmur3_u32(values[i], seed); }
}

extern "C" __global__ void fl_murmur3_hash_u64(const unsigned long long* values, long long n,
                                               unsigned int seed, unsigned int* out) {
    FL_FOR_EACH_INDEX(i, n) { out[i] = fl_murmur3_u64(values[i], seed); }
}

extern "C" __global__ void fl_murmur3_bucket_u32(const unsigned int* values, long long n,
                                                 unsigned int seed, unsigned int num_buckets,
                                                 long long* out) {
    FL_FOR_EACH_INDEX(i, n) { out[i] = fl_murmur3_u32(values[i], seed) % num_buckets; }
}

extern "C" __global__ void fl_murmur3_bucket_u64(const unsigned long long* values, long long n,
                                                 unsigned int seed, unsigned int num_buckets,
                                                 long long* out) {
    FL_FOR_EACH_INDEX(i, n) { out[i] = fl_murmur3_u64(values[i], seed) % num_buckets; }
}

// hash_columns(): every categorical column (width 1: one 8-byte key) or cross (width 2: two keys) of a
// feature-major int64 batch [rows, batch] in one launch. Column k hashes raw rows sources[k * width ...]
// with seeds[k] into out row targets[k] (out is [rows, batch] too).
extern "C" __global__ void fl_hash_columns(const unsigned long long* raw, long long batch,
                                           const long long* sources, int width,
                                           const unsigned int* seeds, const unsigned int* num_buckets,
                                           const long long* targets, long long columns, long long* out) {
    FL_FOR_EACH_INDEX(i, columns * batch) {
        const long long k = i / batch;
        const long long b = i - k * batch;
        const unsigned long long a = raw[sources[k * width] * batch + b];
        const unsigned int h = width == 1
            ? fl_murmur3_u64(a, seeds[k])
            : fl_murmur3_pair_u64(a, raw[sources[k * width + 1] * batch + b], seeds[k]);
        out[targets[k] * batch + b] = h % num_buckets[k];
    }
}
