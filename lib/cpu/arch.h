/* arch.h - the one place that knows the machine's instruction sets: the
 * kernel levels this architecture builds, whether this CPU and its OS run
 * each, and the non-temporal stores (util.c). Porting aft to another
 * architecture is this header and the Makefile's LEVELS: elsewhere there is
 * one level, "base", the kernels built with the compiler's defaults.
 *
 * x86-64: each level is a -march of the x86-64 psABI's, whose instructions
 * the compiler may use anywhere in that level's code, so a level runs only
 * where the CPU has every feature of it and the OS saves the registers
 * those instructions write (XCR0, read with xgetbv: a kernel without
 * AVX-512 state support faults on the first ZMM instruction). */
#ifndef AFT_CPU_ARCH_H
#define AFT_CPU_ARCH_H

#include <stddef.h>
#include <stdio.h>

/* a level: its name (AFT_KERNELS, aft --version) and what it needs */
typedef struct {
    const char *name, *needs;
} aft_arch_level;

#if defined(__x86_64__) && defined(__GNUC__)

#include <cpuid.h>
#include <immintrin.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* X(name) for each level, lowest first: levels.c's tables, aft_kernels_NAME */
#define AFT_ARCH_LEVEL_NAMES(X) X(base) X(avx2) X(avx512)
static const aft_arch_level aft_arch_levels[] = {
    {"base", "x86-64 (SSE2)"},
    {"avx2", "x86-64-v3 (AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE)"},
    {"avx512", "x86-64-v4 (AVX-512 F, BW, CD, DQ, VL)"},
};

/* one feature: where cpuid reports it, and its name for messages */
typedef struct {
    unsigned leaf, reg, bit;   /* reg: 1 ebx, 2 ecx, 3 edx */
    const char *name;
} aft_arch_feature;

/* what each level adds to the one below (x86-64-v2's features belong to
 * avx2's level here: aft has no v2 level) */
static const aft_arch_feature aft_arch_v3[] = {
    {1, 2, 0, "SSE3"},       {1, 2, 9, "SSSE3"},        {1, 2, 12, "FMA"},     {1, 2, 13, "CMPXCHG16B"},
    {1, 2, 19, "SSE4.1"},    {1, 2, 20, "SSE4.2"},      {1, 2, 22, "MOVBE"},   {1, 2, 23, "POPCNT"},
    {1, 2, 27, "OSXSAVE"},   {1, 2, 28, "AVX"},         {1, 2, 29, "F16C"},    {7, 1, 3, "BMI1"},
    {7, 1, 5, "AVX2"},       {7, 1, 8, "BMI2"},         {0x80000001u, 2, 0, "LAHF"},
    {0x80000001u, 2, 5, "LZCNT"},
};
static const aft_arch_feature aft_arch_v4[] = {
    {7, 1, 16, "AVX512F"}, {7, 1, 17, "AVX512DQ"}, {7, 1, 28, "AVX512CD"},
    {7, 1, 30, "AVX512BW"}, {7, 1, 31, "AVX512VL"},
};

static inline int aft_arch_has(const aft_arch_feature *f)
{
    unsigned r[4] = {0, 0, 0, 0};
    if (!__get_cpuid_count(f->leaf, 0, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (r[f->reg] >> f->bit) & 1;
}

/* the register state the OS saves (XCR0); only once OSXSAVE is known */
static inline unsigned long long aft_arch_xcr0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* the first feature of fs (n of them) the CPU lacks, or NULL */
static inline const char *aft_arch_missing(const aft_arch_feature *fs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!aft_arch_has(&fs[i])) return fs[i].name;
    return NULL;
}

/* 1 if this CPU and OS run level i; else 0 and why (cap bytes) */
static inline int aft_arch_runs(size_t i, char *why, size_t cap)
{
    if (i == 0) return 1;
    const char *lack = aft_arch_missing(aft_arch_v3, sizeof aft_arch_v3 / sizeof aft_arch_v3[0]);
    if (!lack && i == 2) lack = aft_arch_missing(aft_arch_v4, sizeof aft_arch_v4 / sizeof aft_arch_v4[0]);
    if (lack) {
        snprintf(why, cap, "the CPU lacks %s", lack);
        return 0;
    }
    /* XCR0 bits 1-2: SSE and AVX state; 5-7: AVX-512's opmask and ZMM */
    unsigned long long want = i == 2 ? 0xe6 : 0x6, xcr0 = aft_arch_xcr0();
    if ((xcr0 & want) != want) {
        snprintf(why, cap, "the OS does not save the %s registers", i == 2 ? "AVX-512" : "AVX");
        return 0;
    }
    return 1;
}

/* The bf16 arithmetic this CPU and OS run, beyond the levels (the avx512
 * level's bf16 kernels, lib/nn/bf16.c, ask): *avx512bf16 for AVX512_BF16
 * (cpuid leaf 7 subleaf 1, eax bit 5: vdpbf16ps, vcvtne2ps2bf16; its
 * registers are AVX-512's, which the avx512 level has checked), *amx for
 * AMX-TILE and AMX-BF16 (leaf 7 edx bits 24 and 22) with the tile state in
 * XCR0 (bits 17, 18) and, on Linux, the process's permission to use it:
 * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), which a kernel that
 * does not grant it refuses. */
static inline void aft_arch_bf16(int *avx512bf16, int *amx)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    *avx512bf16 = *amx = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    unsigned leaf7_subleaves = a, edx = d, osxsave = 0;
    if (__get_cpuid_count(1, 0, &a, &b, &c, &d)) osxsave = (c >> 27) & 1;
    if (!osxsave) return;
    unsigned long long xcr0 = aft_arch_xcr0();
    if ((xcr0 & 0xe6) != 0xe6) return;   /* no AVX-512 state: neither */
    if (leaf7_subleaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) *avx512bf16 = (a >> 5) & 1;
    if (!((edx >> 24) & 1) || !((edx >> 22) & 1)) return;
    if ((xcr0 & (3ull << 17)) != (3ull << 17)) return;
#ifdef __linux__
    /* ARCH_REQ_XCOMP_PERM (0x1023), XFEATURE_XTILEDATA (18): asked once
     * per process; granting it again is a no-op */
    enum { REQ_XCOMP_PERM = 0x1023, XTILEDATA = 18 };
    if (syscall(SYS_arch_prctl, REQ_XCOMP_PERM, XTILEDATA) != 0) return;
#endif
    *amx = 1;
}

/* non-temporal stores of 16-byte vectors (the baseline's widest) */
#define AFT_ARCH_STREAM_FLOATS 4
#define AFT_ARCH_STREAM_ZERO(p) _mm_stream_ps(p, _mm_setzero_ps())
#define AFT_ARCH_STREAM_COPY(p, q) _mm_stream_ps(p, _mm_loadu_ps(q))
#define AFT_ARCH_STREAM_FENCE() _mm_sfence()

#else /* another architecture: one level, no non-temporal stores */

#define AFT_ARCH_LEVEL_NAMES(X) X(base)
static const aft_arch_level aft_arch_levels[] = {
    {"base", "the compiler's defaults for this architecture"},
};

static inline int aft_arch_runs(size_t i, char *why, size_t cap)
{
    (void)i, (void)why, (void)cap;
    return 1;
}

static inline void aft_arch_bf16(int *avx512bf16, int *amx)
{
    *avx512bf16 = *amx = 0;
}

#endif

#endif /* AFT_CPU_ARCH_H */
