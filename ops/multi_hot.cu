// multi_hot(): bucket ids of the first max_len elements of each row, written to the jagged output.
#include "murmur3.cuh"

// Row r owns outputs [out_offsets[r], out_offsets[r + 1]); returns the row owning output i.
FL_HD long long fl_row_of_output(const long long* out_offsets, long long rows, long long i) {
    long long lo = 0, hi = rows + 1;  // first index with out_offsets[index] > i, minus one
    while (lo < hi) {
        const long long mid = lo + (hi - lo) / 2;
        if (out_offsets[mid] <= i) lo = mid + 1; else hi = mid;
    }
    return lo - 1;
}

extern "C" __global__ void fl_multi_hot_bucket_u32(const long long* offsets, const unsigned int* values,
                                                   const long long* out_offsets, long long rows,
                                                   long long total, unsigned int seed,
                                                   unsigned int num_buckets, long long* out) {
    FL_FOR_EACH_INDEX(i, total) {
        const long long r = fl_row_of_output(out_offsets, rows, i);
        out[i] = fl_murmur3_u32(values[offsets[r] + (i - out_offsets[r])], seed) % num_buckets;
    }
}

extern "C" __global__ void fl_multi_hot_bucket_u64(const long long* offsets,
                                                   const unsigned long long* values,
                                                   const long long* out_offsets, long long rows,
                                                   long long total, unsigned int seed,
                                                   unsigned int num_buckets, long long* out) {
    FL_FOR_EACH_INDEX(i, total) {
        const long long r = fl_row_of_output(out_offsets, rows, i);
        out[i] = fl_murmur3_u64(values[offsets[r] + (i - out_offsets[r])], seed) % num_buckets;
    }
}
