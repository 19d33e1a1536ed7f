// normalize_dense(): fill NaN, clip from below, log1p; bit-identical to feedline/ops/normalize_values.py.
#include "log1p64.cuh"

// y, fill and clip_min are float32 values held in doubles; returns the bits of the float32 result.
FL_HD unsigned int fl_normalize_bits(double y, double fill, double clip_min, int do_clip, int do_log) {
    if (y != y) y = fill;
    if (do_clip && y < clip_min) y = clip_min;
    return do_log ? fl_log1p_f32_bits(y) : fl_f64_to_f32_bits(y);
}

extern "C" __global__ void fl_normalize_dense_f32(const float* x, long long n, double fill,
                                                  double clip_min, int do_clip, int do_log,
                                                  float* out) {
    FL_FOR_EACH_INDEX(i, n) {
        const double y = fl_f32_to_f64(x[i]);
        out[i] = fl_float_from_bits(fl_normalize_bits(y, fill, clip_min, do_clip, do_log));
    }
}

// float64 input is first rounded to float32, as x.astype(np.float32) does.
extern "C" __global__ void fl_normalize_dense_f64(const double* x, long long n, double fill,
                                                  double clip_min, int do_clip, int do_log,
                                                  float* out) {
    FL_FOR_EACH_INDEX(i, n) {
        const double y = fl_round_to_f32(x[i]);
        out[i] = fl_float_from_bits(fl_normalize_bits(y, fill, clip_min, do_clip, do_log));
    }
}

// normalize_columns(): several float32 columns of a feature-major batch raw [rows, batch] into a row-major
// block out [batch, columns]; column j reads raw row sources[j]; flags[j]: bit 0 clip, bit 1 log1p.
extern "C" __global__ void fl_normalize_columns(const float* raw, long long batch, const long long* sources,
                                                const float* fill, const float* clip_min, const int* flags,
                                                long long columns, float* out) {
    FL_FOR_EACH_INDEX(i, columns * batch) {
        const long long b = i / columns;
        const long long j = i - b * columns;
        const double y = fl_f32_to_f64(raw[sources[j] * batch + b]);
        out[i] = fl_float_from_bits(fl_normalize_bits(y, fl_f32_to_f64(fill[j]), fl_f32_to_f64(clip_min[j]),
                                                      flags[j] & 1, (flags[j] >> 1) & 1));
    }
}
