// cross(): bucket of murmur3_32 over the 16 bytes a_le || b_le of two int64 columns.
#include "murmur3.cuh"

extern "C" __global__ void fl_cross_bucket(const unsigned long long* a, const unsigned long long* b,
                                           long long n, unsigned int seed,
                                           unsigned int num_buckets, long long* out) {
    FL_FOR_EACH_INDEX(i, n) { out[i] = fl_murmur3_pair_u64(a[i], b[i], seed) % num_buckets; }
}
