// log1p for float32 values, bit-identical to feedline/ops/log1p64.py (definition there).
// Every float64 operation is an explicit round-to-nearest intrinsic on the device, so the compiler
// cannot fuse or reorder; the host versions exist for the CPU-side tests.
#pragma once
#include "float_bits.cuh"

#ifdef __CUDA_ARCH__
#define FL_DADD(a, b) __dadd_rn((a), (b))
#define FL_DSUB(a, b) __dsub_rn((a), (b))
#define FL_DMUL(a, b) __dmul_rn((a), (b))
#define FL_DDIV(a, b) __ddiv_rn((a), (b))
#else
#define FL_DADD(a, b) ((a) + (b))
#define FL_DSUB(a, b) ((a) - (b))
#define FL_DMUL(a, b) ((a) * (b))
#define FL_DDIV(a, b) ((a) / (b))
#endif

// y is a float32 value held in a double; returns the bits of the float32 result.
FL_HD unsigned int fl_log1p_f32_bits(double y) {
    if (y != y || y < -1.0) return 0x7fc00000u;
    if (y == -1.0) return 0xff800000u;
    if (y > 1.7976931348623157e308) return 0x7f800000u;
    if (y < 0x1.0000000000000p-29 && y > -0x1.0000000000000p-29) return fl_f64_to_f32_bits(y);
    const double u = FL_DADD(y, 1.0);
    int e;
    double m = frexp(u, &e);
    if (m < 0x1.6a09e667f3bcdp-1) {
        m = FL_DADD(m, m);
        e -= 1;
    }
    const double k = (double)e;
    const double f = FL_DSUB(m, 1.0);
    const double s = FL_DDIV(f, FL_DADD(f, 2.0));
    const double z = FL_DMUL(s, s);
    double p = 0x1.af286bca1af28p-5;
    p = FL_DADD(FL_DMUL(p, z), 0x1.e1e1e1e1e1e1ep-5);
    p = FL_DADD(FL_DMUL(p, z), 0x1.1111111111111p-4);
    p = FL_DADD(FL_DMUL(p, z), 0x1.3b13b13b13b14p-4);
    p = FL_DADD(FL_DMUL(p, z), 0x1.745d1745d1746p-4);
    p = FL_DADD(FL_DMUL(p, z), 0x1.c71c71c71c71cp-4);
    p = FL_DADD(FL_DMUL(p, z), 0x1.2492492492492p-3);
    p = FL_DADD(FL_DMUL(p, z), 0x1.999999999999ap-3);
    p = FL_DADD(FL_DMUL(p, z), 0x1.5555555555555p-2);
    p = FL_DADD(FL_DMUL(p, z), 0x1.0000000000000p+0);
    return fl_f64_to_f32_bits(FL_DADD(FL_DMUL(k, 0x1.62e42fefa39efp-1), FL_DMUL(FL_DADD(s, s), p)));
}
