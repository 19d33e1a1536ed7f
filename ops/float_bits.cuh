// Exact float32 <-> float64 conversions that stay IEEE-exact when compiled with -ftz=true (CuPy
// always adds it): no float32 arithmetic, comparison or conversion touches a subnormal value.
#pragma once
#include "kernel_common.cuh"

FL_HD unsigned int fl_bits_from_float(float f) {
    union { float f; unsigned int u; } v;
    v.f = f;
    return v.u;
}

FL_HD float fl_float_from_bits(unsigned int u) {
    union { unsigned int u; float f; } v;
    v.u = u;
    return v.f;
}

FL_HD unsigned long long fl_bits_from_double(double d) {
    union { double d; unsigned long long u; } v;
    v.d = d;
    return v.u;
}

FL_HD double fl_double_from_bits(unsigned long long u) {
    union { unsigned long long u; double d; } v;
    v.u = u;
    return v.d;
}

FL_HD double fl_f32_to_f64(float f) {
    const unsigned int b = fl_bits_from_float(f);
    const unsigned long long sign = (unsigned long long)(b >> 31) << 63;
    const unsigned int exponent = (b >> 23) & 0xffu;
    const unsigned long long mantissa = b & 0x7fffffu;
    if (exponent == 0xffu) {  // inf, or NaN keeping its payload, made quiet (as x86 does)
        const unsigned long long quiet = mantissa ? 0x0008000000000000ull : 0;
        return fl_double_from_bits(sign | 0x7ff0000000000000ull | quiet | (mantissa << 29));
    }
    if (exponent == 0) {  // zero or subnormal: mantissa * 2**-149, exact in float64
        const double magnitude = (double)mantissa * 0x1p-149;
        return sign ? -magnitude : magnitude;
    }
    return fl_double_from_bits(sign | ((unsigned long long)(exponent + 896u) << 52) | (mantissa << 29));
}

// Bits of the float32 nearest to r (ties to even, like a C cast); NaN becomes 0x7fc00000.
FL_HD unsigned int fl_f64_to_f32_bits(double r) {
    if (r != r) return 0x7fc00000u;
    const unsigned long long bits = fl_bits_from_double(r);
    const unsigned int sign = (unsigned int)(bits >> 63) << 31;
    const double magnitude = fl_double_from_bits(bits & 0x7fffffffffffffffull);
    if (magnitude < 0x1p-126) {  // subnormal float32 range: a multiple of 2**-149
        return sign | (unsigned int)rint(magnitude * 0x1p149);
    }
#ifdef __CUDA_ARCH__
    return fl_bits_from_float(__double2float_rn(r));  // result is normal or infinite: ftz cannot act
#else
    return fl_bits_from_float((float)r);
#endif
}

FL_HD double fl_round_to_f32(double r) { return fl_f32_to_f64(fl_float_from_bits(fl_f64_to_f32_bits(r))); }
