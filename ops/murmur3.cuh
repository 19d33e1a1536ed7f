// MurmurHash3_x86_32 building blocks, usable on host and device.
#pragma once
#include "kernel_common.cuh"

FL_HD unsigned int fl_rotl32(unsigned int x, int r) { return (x << r) | (x >> (32 - r)); }

FL_HD unsigned int fl_murmur3_mix_k(unsigned int k) {
    k *= 0xcc9e2d51u;
    k = fl_rotl32(k, 15);
    return k * 0x1b873593u;
}

// One 4-byte block into the running state.
FL_HD unsigned int fl_murmur3_step(unsigned int h, unsigned int block) {
    h ^= fl_murmur3_mix_k(block);
    h = fl_rotl32(h, 13);
    return h * 5u + 0xe6546b64u;
}

FL_HD unsigned int fl_murmur3_finish(unsigned int h, unsigned int length) {
    h ^= length;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

FL_HD unsigned int fl_murmur3_u32(unsigned int value, unsigned int seed) {
    return fl_murmur3_finish(fl_murmur3_step(seed, value), 4u);
}

FL_HD unsigned int fl_murmur3_u64(unsigned long long value, unsigned int seed) {
    unsigned int h = fl_murmur3_step(seed, (unsigned int)value);
    h = fl_murmur3_step(h, (unsigned int)(value >> 32));
    return fl_murmur3_finish(h, 8u);
}

// Bytes a || b of two 64-bit values (16 bytes), as used by cross().
FL_HD unsigned int fl_murmur3_pair_u64(unsigned long long a, unsigned long long b, unsigned int seed) {
    unsigned int h = fl_murmur3_step(seed, (unsigned int)a);
    h = fl_murmur3_step(h, (unsigned int)(a >> 32));
    h = fl_murmur3_step(h, (unsigned int)b);
    h = fl_murmur3_step(h, (unsigned int)(b >> 32));
    return fl_murmur3_finish(h, 16u);
}

FL_HD unsigned int fl_murmur3_bytes(const unsigned char* p, long long length, unsigned int seed) {
    unsigned int h = seed;
    const long long nblocks = length / 4;
    for (long long i = 0; i < nblocks; ++i) {
        const unsigned char* b = p + 4 * i;
        h = fl_murmur3_step(h, (unsigned int)b[0] | ((unsigned int)b[1] << 8) |
                                   ((unsigned int)b[2] << 16) | ((unsigned int)b[3] << 24));
    }
    const unsigned char* tail = p + 4 * nblocks;
    unsigned int k = 0;
    switch (length & 3) {
        case 3: k ^= (unsigned int)tail[2] << 16;  // fall through
        case 2: k ^= (unsigned int)tail[1] << 8;   // fall through
        case 1: k ^= (unsigned int)tail[0]; h ^= fl_murmur3_mix_k(k);
    }
    return fl_murmur3_finish(h, (unsigned int)length);
}
