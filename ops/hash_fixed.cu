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
