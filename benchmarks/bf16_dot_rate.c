/* The bf16 dot-product rate of a CPU core against its float32 FMA rate (issue 27, sixth stop).
 *
 * Whether AVX512-BF16 without AMX pays for GEMMs depends on how fast the core issues
 * VDPBF16PS (32 bf16 products per instruction) against VFMADD231PS (16 float32 ones).  A
 * core that issues both at one rate does bf16 at twice float32's FLOPs (the CPU
 * measured bf16 0.40 x fp32 on a big Linear); this Xeon (AVX512-BF16 + AMX, 2 vCPUs) issues
 * VDPBF16PS at a quarter of VFMADD231PS's rate, half float32's FLOPs, so
 * `ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16` here simulates a CPU on which bf16 GEMMs lose
 * (oneDNN's brg_matmul:avx512_core_bf16 runs at about that peak, 103 of 107 FLOP/ns).
 *
 *     gcc -O2 -mavx512f -mavx512bf16 benchmarks/bf16_dot_rate.c -o /tmp/bf16_dot_rate && /tmp/bf16_dot_rate
 *
 * 16 independent accumulators (more than latency x ports), kept in registers: the empty asm
 * statements stop the compiler from folding the loop without spilling the accumulators.
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define KEEP8(a, b, c, d, e, f, g, h) __asm__ volatile("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d), "+v"(e), "+v"(f), "+v"(g), "+v"(h))
#define STEP16(OP) \
    a0 = OP(a0); a1 = OP(a1); a2 = OP(a2); a3 = OP(a3); a4 = OP(a4); a5 = OP(a5); a6 = OP(a6); a7 = OP(a7); \
    a8 = OP(a8); a9 = OP(a9); a10 = OP(a10); a11 = OP(a11); a12 = OP(a12); a13 = OP(a13); a14 = OP(a14); a15 = OP(a15); \
    KEEP8(a0, a1, a2, a3, a4, a5, a6, a7); KEEP8(a8, a9, a10, a11, a12, a13, a14, a15)

int main(void) {
    const long n = 10000000;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m512 a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
    const __m512 x = _mm512_set1_ps(1e-9f), y = _mm512_set1_ps(1.0f);
    const __m512bh bx = (__m512bh)_mm512_set1_epi16(0x3f80), by = (__m512bh)_mm512_set1_epi16(0x0001);
#define FMA(acc) _mm512_fmadd_ps(x, y, acc)
#define DOT(acc) _mm512_dpbf16_ps(acc, bx, by)
    for (int rep = 0; rep < 3; rep++) {
        double start = now();
        for (long i = 0; i < n; i++) { STEP16(FMA); }
        double fma = now() - start;
        start = now();
        for (long i = 0; i < n; i++) { STEP16(DOT); }
        double dot = now() - start;
        double ops = (double)n * 16;
        printf("vfmadd231ps zmm %.3f ns (%.0f fp32 FLOP/ns), vdpbf16ps zmm %.3f ns (%.0f bf16 FLOP/ns): bf16/fp32 %.2f\n",
               fma / ops * 1e9, 32 * ops / fma * 1e-9, dot / ops * 1e9, 64 * ops / dot * 1e-9, (64 / dot) / (32 / fma));
    }
    float sink[16];
    _mm512_storeu_ps(sink, _mm512_add_ps(_mm512_add_ps(a0, a15), _mm512_add_ps(a7, a8)));
    return sink[0] == 1234.0f;
}
