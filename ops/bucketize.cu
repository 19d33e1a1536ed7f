// bucketize(): numpy.digitize(x, bins, right=False) for monotone bins without NaN.
// Float operands are compared as float64: exact for float32 values, and NumPy's float64 comparison
// when the common type is float64 (the caller converts other types as NumPy would).
#include "float_bits.cuh"

FL_HD double fl_compare_value(float v) { return fl_f32_to_f64(v); }
FL_HD double fl_compare_value(double v) { return v; }
FL_HD long long fl_compare_value(long long v) { return v; }
FL_HD unsigned long long fl_compare_value(unsigned long long v) { return v; }

// Increasing bins: how many bins are <= x (NaN -> nbins, as NaN sorts last in NumPy).
// Decreasing bins: how many bins are > x (NaN -> 0).
template <typename TX, typename TB>
FL_HD long long fl_digitize(TX x_stored, const TB* bins, long long nbins, int descending) {
    const auto x = fl_compare_value(x_stored);
    if (x != x) return descending ? 0 : nbins;
    long long lo = 0, hi = nbins;
    while (lo < hi) {
        const long long mid = lo + (hi - lo) / 2;
        const auto bin = fl_compare_value(bins[mid]);
        const bool before = descending ? (bin > x) : (bin <= x);
        if (before) lo = mid + 1; else hi = mid;
    }
    return lo;
}

#define FL_DEFINE_BUCKETIZE(SUFFIX, TX, TB)                                                    \
    extern "C" __global__ void fl_bucketize_##SUFFIX(const TX* x, long long n, const TB* bins, \
                                                     long long nbins, int descending,          \
                                                     long long* out) {                         \
        FL_FOR_EACH_INDEX(i, n) { out[i] = fl_digitize<TX, TB>(x[i], bins, nbins, descending); } \
    }

FL_DEFINE_BUCKETIZE(f32_f32, float, float)
FL_DEFINE_BUCKETIZE(f32_f64, float, double)
FL_DEFINE_BUCKETIZE(f64_f32, double, float)
FL_DEFINE_BUCKETIZE(f64_f64, double, double)
FL_DEFINE_BUCKETIZE(i64_i64, long long, long long)
FL_DEFINE_BUCKETIZE(u64_u64, unsigned long long, unsigned long long)
