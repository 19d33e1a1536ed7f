// murmur3_32 / hash_buckets for strings given as int64 offsets (n + 1) into uint8 data.
#include "murmur3.cuh"

extern "C" __global__ void fl_murmur3_hash_strings(const long long* offsets,
                                                   const unsigned char* data, long long n,
                                                   unsigned int seed, unsigned int* out) {
    FL_FOR_EACH_INDEX(i, n) {
        out[i] = fl_murmur3_bytes(data + offsets[i], offsets[i + 1] - offsets[i], seed);
    }
}

extern "C" __global__ void fl_murmur3_bucket_strings(const long long* offsets,
                                                     const unsigned char* data, long long n,
                                                     unsigned int seed, unsigned int num_buckets,
                                                     long long* out) {
    FL_FOR_EACH_INDEX(i, n) {
        out[i] = fl_murmur3_bytes(data + offsets[i], offsets[i + 1] - offsets[i], seed) % num_buckets;
    }
}
