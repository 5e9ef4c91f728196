/* Paged attention over a slot pool for CPUs, fp32: extend (causal over cached prefix + new
 * tokens) and decode (one new token) are the same loop, so a mixed batch needs nothing more.
 *
 * Layout (FlashInfer's ragged convention): request r owns query rows
 * [qo_indptr[r], qo_indptr[r+1]) and attends to the slots kv_indices[kv_indptr[r] .. kv_indptr[r+1]),
 * its new tokens being the last ones. q and out are [T, Hq, D]; the pools are [S, Hkv, D].
 *
 * One work item is (query row, kv head): its G = Hq / Hkv query heads share every K/V row read,
 * so each cached row is loaded once per item whatever the GQA ratio. Two passes (scores, then the
 * weighted sum of V) over a per-thread score buffer; no padded copy of any request's K/V exists.
 * An item's result depends only on its own request (no split across threads or batch size), so a
 * request's numerics do not depend on what it is batched with.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TL_AVX2 1
#endif
/* The 512-bit path computes exactly what the 256-bit one does, lane for lane: the same multiplies and
 * fused multiply-adds in the same order per lane, the same tree of additions per dot product, the same
 * order of partial sums. Wider registers only let two query heads (or two query rows) share one
 * instruction, so a request's result does not depend on which path the machine builds
 * (tests/kernels/test_paged_attention.py builds both and compares them bit for bit). */
#if defined(TL_AVX2) && defined(__AVX512F__) && defined(__AVX512DQ__)
#define TL_AVX512 1
#endif

typedef struct {
    const float *q, *k_pool, *v_pool;
    const int64_t *qo_indptr, *kv_indptr, *kv_indices;
    const int32_t *row_request;
    const int32_t *block_row; /* first query row of each block of ROWS_PER_BLOCK or fewer rows of one request */
    int32_t num_blocks;
    float *out;
    int32_t num_rows, hq, hkv, d;
    int64_t max_kv_len;
    float scale;
    atomic_long next_item;
    atomic_int failed;
} Job;

#define ITEMS_PER_GRAB 4
/* Query rows of one request handled together, each with its own sums: an extend's neighbouring rows see
 * the same keys (the second one more), so their value passes share every V row loaded and give the
 * fused multiply-adds two independent chains to overlap. One row where only the 256-bit path exists. */
#ifdef TL_AVX512
#define ROWS_PER_BLOCK 2
#else
#define ROWS_PER_BLOCK 1
#endif
/* Key rows visited (all query rows, all kv heads) below which the call runs on the calling thread alone.
 * It was 16,384 while a helper thread was created per call (a batch-2 decode of the tiny model at KV 200
 * then spent 0.51 ms a layer waiting for it). On the process's OpenMP team, already awake from the
 * compiled graph's loops, a lower bar wins: offline rounds of the tiny model (48 requests, decode batches
 * of ~30 at KV ~250, i.e. ~15,000 visits, were all serial), same process, ABBA over 16 pairs: 2,048
 * against 16,384 a median 1.084x the throughput (14 of 16 above 1); 512 against 2,048 1.006x (8 of 16).
 * A batch-1 decode (2 x its KV length in visits) stays serial up to KV 1,024. */
#define SERIAL_KEY_VISITS 2048
/* Slots ahead: enough DRAM latencies' worth of the loop's work to keep a core's misses in flight. */
#define PREFETCH_AHEAD 48
/* Into L2, not L1 (prefetcht1, not prefetcht0): a core has far more outstanding L2 misses than L1 fill
 * buffers, and a decode row's K and V come from DRAM once the pool outgrows L3. One layer of a batch-64
 * decode of the tiny model's heads (KV 320, four layers' pools in turn, the L3 swept between passes), the
 * kernel alone on one thread, median ms, Zen 4: slots as the engine lays them out (prompt runs, decode
 * slots interleaved) 1.02 at 16 slots into L1 -> 0.79 at 16 into L2 -> 0.64 at 48 into L2 (0.63 at 64,
 * 0.68 at 96); slots shuffled 1.49 -> 0.69; one pool left in L3, 0.34 -> 0.32. No prefetch at all, as
 * measured on the first machine (AVX2 EPYC): 1.62 ms in slot order, 2.88 scattered, against 1.29 and 2.05
 * at 16 into L1. */
#define PREFETCH_LOCALITY 2

/* Asks for the `floats` floats at `offset` of each of `n` pool rows, ahead of their use. A request's rows
 * are wherever its slots put them, so the hardware prefetcher cannot guess the next one. */
static inline void prefetch_rows(const float *pool, const int64_t *slots, int32_t n, int64_t stride, int64_t offset,
                                 int32_t floats) {
    for (int32_t i = 0; i < n; i++) {
        const char *row = (const char *)(pool + slots[i] * stride + offset);
        for (int32_t b = 0; b < floats * (int32_t)sizeof(float); b += 64) __builtin_prefetch(row + b, 0, PREFETCH_LOCALITY);
    }
}

#ifdef TL_AVX2
/* The eight lane-sums of a0..a7 as one vector: one horizontal add tree instead of eight. */
static inline __m256 sum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* exp on eight lanes for x <= 0 (scores minus their maximum): 2^n * p(r) with r = x - n ln2 in
 * [-ln2/2, ln2/2] and a degree-6 polynomial, within 2 ulp of expf. Inputs below -87 are clamped
 * there (exp(-87) ~ 1.6e-38, a weight that adds nothing), which keeps 2^n a normal float. */
static inline __m256 exp8_nonpositive(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); /* ln2 split in two for exactness */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

#ifdef TL_AVX512
/* _mm256_hadd_ps on each 256-bit half: within every 128-bit lane [a0+a1, a2+a3, b0+b1, b2+b3]. */
static inline __m512 hadd_halves(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* `sum8` on each 256-bit half of a0..a7: the low half's eight sums, then the high half's. */
static inline __m512 sum8_halves(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5, __m512 a6,
                                 __m512 a7) {
    const __m512 u0 = hadd_halves(hadd_halves(a0, a1), hadd_halves(a2, a3));
    const __m512 u1 = hadd_halves(hadd_halves(a4, a5), hadd_halves(a6, a7));
    /* sum8's permute2f128 pairs, per half: lanes 0-3 of u0 with 0-3 of u1 plus lanes 4-7 of u0 with 4-7 of u1. */
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    return _mm512_add_ps(_mm512_permutex2var_ps(u0, lo, u1), _mm512_permutex2var_ps(u0, hi, u1));
}

/* exp8_nonpositive on sixteen lanes, the same operations per lane. */
static inline __m512 exp16_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* One block of eight keys for two query heads at once (q0 in the low half, q1 in the high half of each
 * register): the 256-bit block's multiply-adds per head, each key row loaded once for both. */
static inline __attribute__((always_inline)) void score_block_pair(const float *q0, const float *q1, const float *const k[8],
                                                                   __m512 vscale, float *s0, float *s1, const int32_t d) {
    __m512 acc[8];
    for (int32_t jj = 0; jj < 8; jj++) {
        __m512 qq = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(q0)), _mm256_loadu_ps(q1), 1);
        __m512 a = _mm512_mul_ps(qq, _mm512_broadcast_f32x8(_mm256_loadu_ps(k[jj])));
        for (int32_t i = 8; i < d; i += 8) {
            qq = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(q0 + i)), _mm256_loadu_ps(q1 + i), 1);
            a = _mm512_fmadd_ps(qq, _mm512_broadcast_f32x8(_mm256_loadu_ps(k[jj] + i)), a);
        }
        acc[jj] = a;
    }
    const __m512 sums = _mm512_mul_ps(sum8_halves(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]), vscale);
    _mm256_storeu_ps(s0, _mm512_castps512_ps256(sums));
    _mm256_storeu_ps(s1, _mm512_extractf32x8_ps(sums, 1));
}
#endif

/* Scores of the G query heads sharing kv head h against `visible` keys:
 * scores[g * pitch + j] = scale * q_g . k_j. Blocks of eight keys, every head per block, so each
 * key row is read from memory once whatever the GQA ratio. */
static inline __attribute__((always_inline)) void score_keys(const float *q, int32_t g_count, const float *k_pool,
                                                             const int64_t *slots, int64_t visible, int64_t stride,
                                                             int64_t h, float scale, float *scores, int64_t pitch,
                                                             const int32_t d, const int prefetch, const int wide) {
    (void)wide; /* read by the 512-bit path only */
    int64_t j = 0;
#ifdef TL_AVX2
    if (d % 8 == 0) {
        const __m256 vscale = _mm256_set1_ps(scale);
        /* The last visible % 8 keys make a block too, the missing keys standing in as copies of the last one
         * and their scores dropped: each key's score then has one arithmetic, the block's, wherever it falls
         * and whatever the build. (Left to an `omp simd` reduction, the tail's sum took the vector width the
         * compiler chose, 512-bit on a Zen 4 with AVX-512 and 256-bit without, and its order with it.) */
        for (; j < visible; j += 8) {
            const int32_t n_in = visible - j < 8 ? (int32_t)(visible - j) : 8;
            const float *k[8];
            for (int32_t jj = 0; jj < 8; jj++) k[jj] = k_pool + slots[j + (jj < n_in ? jj : n_in - 1)] * stride + h * d;
            if (prefetch && j + PREFETCH_AHEAD + 8 <= visible) prefetch_rows(k_pool, slots + j + PREFETCH_AHEAD, 8, stride, h * d, d);
            float part[2][8]; /* a partial block's scores, before the first n_in are kept */
            int32_t g = 0;
#ifdef TL_AVX512
            for (; wide && g + 2 <= g_count; g += 2) {
                float *s0 = n_in == 8 ? scores + g * pitch + j : part[0];
                float *s1 = n_in == 8 ? scores + (g + 1) * pitch + j : part[1];
                score_block_pair(q + (int64_t)g * d, q + (int64_t)(g + 1) * d, k, _mm512_set1_ps(scale), s0, s1, d);
                if (n_in < 8) {
                    memcpy(scores + g * pitch + j, part[0], sizeof(float) * (size_t)n_in);
                    memcpy(scores + (g + 1) * pitch + j, part[1], sizeof(float) * (size_t)n_in);
                }
            }
#endif
            for (; g < g_count; g++) {
                const float *qg = q + (int64_t)g * d;
                __m256 acc[8];
                for (int32_t jj = 0; jj < 8; jj++) {
                    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(qg), _mm256_loadu_ps(k[jj]));
                    for (int32_t i = 8; i < d; i += 8)
                        a = _mm256_fmadd_ps(_mm256_loadu_ps(qg + i), _mm256_loadu_ps(k[jj] + i), a);
                    acc[jj] = a;
                }
                float *s = n_in == 8 ? scores + g * pitch + j : part[0];
                _mm256_storeu_ps(s, _mm256_mul_ps(sum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]), vscale));
                if (n_in < 8) memcpy(scores + g * pitch + j, part[0], sizeof(float) * (size_t)n_in);
            }
        }
    }
#endif
    for (; j < visible; j++) {
        const float *k = k_pool + slots[j] * stride + h * d;
        for (int32_t g = 0; g < g_count; g++) {
            const float *qg = q + (int64_t)g * d;
            float dot = 0.0f;
            /* Only a head dim that is not a multiple of 8 gets here on an x86 build: in order, so that no
             * vector width is the compiler's to choose. Elsewhere (no AVX2) this is the only path. */
#ifndef TL_AVX2
#pragma omp simd reduction(+ : dot)
#endif
            for (int32_t i = 0; i < d; i++) dot += qg[i] * k[i];
            scores[g * pitch + j] = dot * scale;
        }
    }
}

/* s[j] = exp(s[j] - max s) in place; returns the sum. */
static inline float exp_shifted(float *s, int64_t n, const int wide) {
    (void)wide; /* read by the 512-bit path only */
    float max = -INFINITY, sum = 0.0f;
    int64_t j = 0;
#ifdef TL_AVX2
    /* Eight running maxima, then one across them: a scalar scan is a chain of dependent compares. */
    if (n >= 8) {
        __m256 vm = _mm256_loadu_ps(s);
        for (j = 8; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
        float lanes_max[8];
        _mm256_storeu_ps(lanes_max, vm);
        for (int32_t i = 0; i < 8; i++) max = lanes_max[i] > max ? lanes_max[i] : max;
    }
#endif
    for (; j < n; j++) max = s[j] > max ? s[j] : max;
    j = 0;
#ifdef TL_AVX2
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 vsum = _mm256_setzero_ps();
#ifdef TL_AVX512
    /* Sixteen at a time, their two halves added to the eight partial sums in the 256-bit loop's order. */
    for (; wide && j + 16 <= n; j += 16) {
        const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + j), _mm512_set1_ps(max)));
        _mm512_storeu_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, _mm512_castps512_ps256(e));
        vsum = _mm256_add_ps(vsum, _mm512_extractf32x8_ps(e, 1));
    }
#endif
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmax));
        _mm256_storeu_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vsum);
    for (int32_t i = 0; i < 8; i++) sum += lanes[i];
#endif
    for (; j < n; j++) {
        s[j] = expf(s[j] - max);
        sum += s[j];
    }
    return sum;
}

#ifdef TL_AVX2
/* acc[g * d + i] = sum_j w[g * pitch + j] * v_j[offset + i] for G query heads and `nv` eight-float columns
 * of the `visible` value rows, the G x nv partial sums held in registers for the whole pass (G and nv
 * are literals at every call): summed in memory, every row cost G x D/8 loads and stores of the sums on
 * top of its own loads. */
static inline __attribute__((always_inline)) void weigh_columns(const float *v_pool, const int64_t *slots,
                                                                int64_t visible, int64_t stride, int64_t offset,
                                                                const float *w, int64_t pitch, float *acc,
                                                                int32_t d, const int32_t g_count, const int32_t nv,
                                                                const int prefetch) {
    /* Fixed-size arrays, not sum[g_count][nv]: once the loops unroll, the compiler keeps fixed ones in
     * registers, a variable-length one on the stack. With the row loaded once for every head, measured on
     * one layer's extend (2 x 256 tokens, same process, alternating, bitwise equal): 0.73-0.92x the time
     * at d 32, G 2; 0.91-0.94x at d 64. */
    __m256 sum[8];
    for (int32_t g = 0; g < g_count; g++)
        for (int32_t i = 0; i < nv; i++) sum[g * nv + i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < visible; j++) {
        const float *v = v_pool + slots[j] * stride + offset;
        if (prefetch && j + PREFETCH_AHEAD < visible) prefetch_rows(v_pool, slots + j + PREFETCH_AHEAD, 1, stride, offset, 8 * nv);
        __m256 row[8];
        for (int32_t i = 0; i < nv; i++) row[i] = _mm256_loadu_ps(v + 8 * i);
        for (int32_t g = 0; g < g_count; g++) {
            const __m256 p = _mm256_broadcast_ss(w + g * pitch + j);
            for (int32_t i = 0; i < nv; i++) sum[g * nv + i] = _mm256_fmadd_ps(p, row[i], sum[g * nv + i]);
        }
    }
    for (int32_t g = 0; g < g_count; g++)
        for (int32_t i = 0; i < nv; i++) _mm256_storeu_ps(acc + g * d + 8 * i, sum[g * nv + i]);
}

/* The register path for head dims 32 and 64; false: use the plain loop. At most eight sums are live
 * (beside a broadcast weight and the loaded row): both heads at once for d 32 with
 * G 2 (each V row read once), else one head and up to 64 columns per pass over the rows. Head dim 128
 * or more keeps the plain loop: per-head passes measured 1.09x its time (d 128, G 4), whose sums in
 * L1 are then 16 independent chains. */
static inline int weigh_values_fast(const float *v_pool, const int64_t *slots, int64_t visible, int64_t stride,
                                    int64_t h, const float *w, int64_t pitch, float *acc, int32_t d, int32_t g_count,
                                    int prefetch) {
    if (d != 32 && d != 64) return 0;
    if (d == 32 && g_count == 2) {
        weigh_columns(v_pool, slots, visible, stride, h * d, w, pitch, acc, d, 2, 4, prefetch);
        return 1;
    }
    for (int32_t g = 0; g < g_count; g++)
        for (int32_t c = 0; c < d; c += 64) {
            const int64_t offset = h * d + c;
            if (d - c >= 64) weigh_columns(v_pool, slots, visible, stride, offset, w + g * pitch, pitch, acc + g * d + c, d, 1, 8, prefetch);
            else weigh_columns(v_pool, slots, visible, stride, offset, w + g * pitch, pitch, acc + g * d + c, d, 1, 4, prefetch);
        }
    return 1;
}
#endif

#ifdef TL_AVX512
/* weigh_columns for `nr` query rows of one request and `gn` heads, sixteen columns a register: row 0
 * weighs the first `visible` value rows, row 1 (where nr is 2) those and `extra` (0 or 1) more. Every
 * output lane's chain of multiply-adds runs over the rows in the 256-bit path's order; two rows give
 * the value pass twice the independent chains, each V row loaded once for both. */
static inline __attribute__((always_inline)) void weigh_rows(const float *v_pool, const int64_t *slots, int64_t visible,
                                                             int32_t extra, int64_t stride, int64_t offset,
                                                             const float *const w[2], int64_t pitch,
                                                             float *const acc[2], int32_t d, const int32_t nr,
                                                             const int32_t gn, const int32_t nz, const int prefetch) {
    __m512 sum[16];
    for (int32_t i = 0; i < nr * gn * nz; i++) sum[i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < visible; j++) {
        const float *v = v_pool + slots[j] * stride + offset;
        if (prefetch && j + PREFETCH_AHEAD < visible) prefetch_rows(v_pool, slots + j + PREFETCH_AHEAD, 1, stride, offset, 16 * nz);
        __m512 row[4];
        for (int32_t z = 0; z < nz; z++) row[z] = _mm512_loadu_ps(v + 16 * z);
        for (int32_t r = 0; r < nr; r++)
            for (int32_t g = 0; g < gn; g++) {
                const __m512 p = _mm512_set1_ps(w[r][g * pitch + j]);
                for (int32_t z = 0; z < nz; z++)
                    sum[(r * gn + g) * nz + z] = _mm512_fmadd_ps(p, row[z], sum[(r * gn + g) * nz + z]);
            }
    }
    /* The second row's one key more (its own token), last in its chains as in the one-row pass. Kept out
     * of the loop above so that every index there is a literal and the sums stay in registers. */
    if (nr == 2 && extra) {
        const float *v = v_pool + slots[visible] * stride + offset;
        for (int32_t g = 0; g < gn; g++) {
            const __m512 p = _mm512_set1_ps(w[1][g * pitch + visible]);
            for (int32_t z = 0; z < nz; z++)
                sum[(gn + g) * nz + z] = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 16 * z), sum[(gn + g) * nz + z]);
        }
    }
    for (int32_t r = 0; r < nr; r++)
        for (int32_t g = 0; g < gn; g++)
            for (int32_t z = 0; z < nz; z++) _mm512_storeu_ps(acc[r] + g * d + 16 * z, sum[(r * gn + g) * nz + z]);
}

/* weigh_values_fast for a block of one or two rows, on the cases it covers (head dims 32 and 64):
 * heads two at a time where their count is even. False: use the per-row path. */
static inline int weigh_block_wide(const float *v_pool, const int64_t *slots, int64_t visible, int32_t extra,
                                   int64_t stride, int64_t h, const float *const w[2], int64_t pitch,
                                   float *const acc[2], int32_t d, int32_t g_count, int32_t nr, int prefetch) {
    if (d != 32 && d != 64) return 0;
    const int32_t step = g_count % 2 == 0 ? 2 : 1;
    for (int32_t g = 0; g < g_count; g += step) {
        const float *wg[2] = {w[0] + g * pitch, w[1] + g * pitch};
        float *ag[2] = {acc[0] + g * d, acc[1] + g * d};
        const int64_t offset = h * d;
        if (d == 32 && step == 2 && nr == 2) weigh_rows(v_pool, slots, visible, extra, stride, offset, wg, pitch, ag, d, 2, 2, 2, prefetch);
        else if (d == 32 && step == 2) weigh_rows(v_pool, slots, visible, extra, stride, offset, wg, pitch, ag, d, 1, 2, 2, prefetch);
        else if (d == 32 && nr == 2) weigh_rows(v_pool, slots, visible, extra, stride, offset, wg, pitch, ag, d, 2, 1, 2, prefetch);
        else if (d == 32) weigh_rows(v_pool, slots, visible, extra, stride, offset, wg, pitch, ag, d, 1, 1, 2, prefetch);
        else if (step == 2 && nr == 2) weigh_rows(v_pool, slots, visible, extra, stride, offset, wg, pitch, ag, d, 2, 2, 4, prefetch);
        else if (step == 2) weigh_rows(v_pool, slots, visible, extra, stride, offset, wg, pitch, ag, d, 1, 2, 4, prefetch);
        else if (nr == 2) weigh_rows(v_pool, slots, visible, extra, stride, offset, wg, pitch, ag, d, 2, 1, 4, prefetch);
        else weigh_rows(v_pool, slots, visible, extra, stride, offset, wg, pitch, ag, d, 1, 1, 4, prefetch);
    }
    return 1;
}
#endif

/* `d` is a literal at every call below, so the compiler unrolls and vectorises the head-dim loops. */
/* One row's value pass: acc[g * d + i] = sum over the visible V rows of weight x value, per head. */
static inline __attribute__((always_inline)) void weigh_values_row(const Job *job, const int64_t *slots, int64_t visible,
                                                                   int64_t stride, int32_t h, const float *w, int64_t pitch,
                                                                   float *acc, const int32_t d, int32_t g_count, int prefetch) {
#ifdef TL_AVX2
    if (weigh_values_fast(job->v_pool, slots, visible, stride, h, w, pitch, acc, d, g_count, prefetch)) return;
#endif
    memset(acc, 0, sizeof(float) * (size_t)g_count * (size_t)d);
    for (int64_t j = 0; j < visible; j++) {
        const float *v = job->v_pool + slots[j] * stride + (int64_t)h * d;
        for (int32_t g = 0; g < g_count; g++) {
            const float p = w[(int64_t)g * pitch + j];
            float *a = acc + (int64_t)g * d;
#pragma omp simd
            for (int32_t i = 0; i < d; i++) a[i] += p * v[i];
        }
    }
}

static inline __attribute__((always_inline)) void attend_block_d(const Job *job, int64_t item, float *scores,
                                                                 float *acc, const int32_t d) {
    const int32_t block = (int32_t)(item / job->hkv), h = (int32_t)(item % job->hkv);
    const int32_t g_count = job->hq / job->hkv;
    const int32_t first = job->block_row[block];
    const int32_t r = job->row_request[first];
    const int64_t n_new = job->qo_indptr[r + 1] - job->qo_indptr[r];
    const int64_t kv_len = job->kv_indptr[r + 1] - job->kv_indptr[r];
    const int64_t rows_left = job->qo_indptr[r + 1] - first;
    const int32_t nr = rows_left < ROWS_PER_BLOCK ? (int32_t)rows_left : ROWS_PER_BLOCK;
    const int64_t *slots = job->kv_indices + job->kv_indptr[r];
    const int64_t stride = (int64_t)job->hkv * d;
    const int64_t pitch = job->max_kv_len;
    /* A decode row's keys are the request's whole history, mostly out of cache; an extend's were mostly
     * just written by this forward, and asking for them again measured 5-12 % slower. */
    const int prefetch = n_new == 1;
    /* The 512-bit paths serve two-row blocks (extends) at head dims 32 and 64, where they were measured to
     * win: one layer's extend of 2 x 256 tokens, 0.72 -> 0.58 ms at d 32 (G 2), 3.07 -> 1.81 ms at d 64.
     * A decode row is bound by memory, not by its arithmetic; there the wider path read 0-7 % slower. */
    int wide = 0;
#ifdef TL_AVX512
    wide = nr == 2 && (d == 32 || d == 64);
#endif
    int64_t visible[ROWS_PER_BLOCK] = {0};
    float inv_sum[ROWS_PER_BLOCK][g_count];
    const float *w[2] = {scores, scores};
    float *a[2] = {acc, acc};
    for (int32_t k = 0; k < nr; k++) {
        const int32_t row = first + k;
        visible[k] = kv_len - n_new + (row - job->qo_indptr[r]) + 1; /* causal */
        /* The loops prefetch PREFETCH_AHEAD slots ahead of themselves, so a decode row's first keys and
         * values would each wait a DRAM latency: asked for here, the values have the whole score pass to
         * arrive. Same measurement as at PREFETCH_AHEAD: 0.65 -> 0.56 ms in the engine's layout, 0.71 ->
         * 0.55 shuffled. */
        if (prefetch) {
            const int32_t head = visible[k] < PREFETCH_AHEAD ? (int32_t)visible[k] : PREFETCH_AHEAD;
            prefetch_rows(job->k_pool, slots, head, stride, (int64_t)h * d, d);
            prefetch_rows(job->v_pool, slots, head, stride, (int64_t)h * d, d);
        }
        const float *q = job->q + ((int64_t)row * job->hq + (int64_t)h * g_count) * d;
        float *s = scores + (int64_t)k * g_count * pitch;
        score_keys(q, g_count, job->k_pool, slots, visible[k], stride, h, job->scale, s, pitch, d, prefetch, wide);
        for (int32_t g = 0; g < g_count; g++) inv_sum[k][g] = 1.0f / exp_shifted(s + (int64_t)g * pitch, visible[k], wide);
        w[k] = s;
        a[k] = acc + (int64_t)k * g_count * d;
    }
    int summed = 0;
#ifdef TL_AVX512
    if (wide)
        summed = weigh_block_wide(job->v_pool, slots, visible[0], (int32_t)(visible[1] - visible[0]), stride, h, w, pitch,
                                  a, d, g_count, 2, prefetch);
#endif
    for (int32_t k = 0; k < nr && !summed; k++) weigh_values_row(job, slots, visible[k], stride, h, w[k], pitch, a[k], d, g_count, prefetch);
    /* Normalised once at the end: the weights' sum scales the d outputs, not every weight. */
    for (int32_t k = 0; k < nr; k++) {
        float *out = job->out + ((int64_t)(first + k) * job->hq + (int64_t)h * g_count) * d;
        for (int32_t g = 0; g < g_count; g++)
            for (int32_t i = 0; i < d; i++) out[(int64_t)g * d + i] = a[k][(int64_t)g * d + i] * inv_sum[k][g];
    }
}

static void attend_item(const Job *job, int64_t item, float *scores, float *acc) {
    switch (job->d) {
    case 64: attend_block_d(job, item, scores, acc, 64); break;
    case 128: attend_block_d(job, item, scores, acc, 128); break;
    case 32: attend_block_d(job, item, scores, acc, 32); break;
    case 256: attend_block_d(job, item, scores, acc, 256); break;
    default: attend_block_d(job, item, scores, acc, job->d);
    }
}

static void *worker(void *arg) {
    Job *job = (Job *)arg;
    const int32_t g_count = job->hq / job->hkv;
    float *scores = malloc(sizeof(float) * ROWS_PER_BLOCK * (size_t)g_count * (size_t)job->max_kv_len);
    float *acc = malloc(sizeof(float) * ROWS_PER_BLOCK * (size_t)g_count * (size_t)job->d);
    if (scores == NULL || acc == NULL) {
        atomic_store(&job->failed, 1);
        free(scores);
        free(acc);
        return NULL;
    }
    const int64_t items = (int64_t)job->num_blocks * job->hkv;
    for (;;) {
        const int64_t first = atomic_fetch_add(&job->next_item, ITEMS_PER_GRAB);
        if (first >= items) break;
        const int64_t last = first + ITEMS_PER_GRAB < items ? first + ITEMS_PER_GRAB : items;
        for (int64_t item = first; item < last; item++) attend_item(job, item, scores, acc);
    }
    free(scores);
    free(acc);
    return NULL;
}

/* Key rows the batch's query rows see in all (causal), per kv head: the call's work, roughly. */
static int64_t key_visits(const int64_t *qo_indptr, const int64_t *kv_indptr, int32_t num_requests) {
    int64_t visits = 0;
    for (int32_t r = 0; r < num_requests; r++) {
        const int64_t n_new = qo_indptr[r + 1] - qo_indptr[r], kv_len = kv_indptr[r + 1] - kv_indptr[r];
        visits += n_new * (kv_len - n_new) + n_new * (n_new + 1) / 2;
    }
    return visits;
}

/* Returns 0 on success, 1 when memory for a scratch buffer or a thread could not be had. */
int tl_paged_attention_f32(const float *q, const float *k_pool, const float *v_pool, const int64_t *qo_indptr,
                           const int64_t *kv_indptr, const int64_t *kv_indices, int32_t num_requests,
                           int32_t hq, int32_t hkv, int32_t d, float scale, float *out, int32_t num_threads) {
    const int32_t num_rows = (int32_t)qo_indptr[num_requests];
    int32_t *row_request = malloc(sizeof(int32_t) * (size_t)(num_rows > 0 ? num_rows : 1));
    int32_t *block_row = malloc(sizeof(int32_t) * (size_t)(num_rows > 0 ? num_rows : 1));
    if (row_request == NULL || block_row == NULL) {
        free(row_request);
        free(block_row);
        return 1;
    }
    int64_t max_kv_len = 1;
    int32_t num_blocks = 0;
    for (int32_t r = 0; r < num_requests; r++) {
        for (int64_t row = qo_indptr[r]; row < qo_indptr[r + 1]; row++) row_request[row] = r;
        /* Blocks start at the request's own first row: its result never depends on its neighbours. */
        for (int64_t row = qo_indptr[r]; row < qo_indptr[r + 1]; row += ROWS_PER_BLOCK) block_row[num_blocks++] = (int32_t)row;
        const int64_t len = kv_indptr[r + 1] - kv_indptr[r];
        max_kv_len = len > max_kv_len ? len : max_kv_len;
    }
    Job job = {q, k_pool, v_pool, qo_indptr, kv_indptr, kv_indices, row_request, block_row, num_blocks, out,
               num_rows, hq, hkv, d, max_kv_len, scale, 0, 0};
    const int64_t items = (int64_t)num_blocks * hkv;
    int32_t threads = num_threads;
    if (threads > items / ITEMS_PER_GRAB) threads = (int32_t)(items / ITEMS_PER_GRAB);
    if (key_visits(qo_indptr, kv_indptr, num_requests) * hkv < SERIAL_KEY_VISITS) threads = 1;
    if (threads <= 1) {
        worker(&job);
    } else {
#ifdef _OPENMP
        /* Built with OpenMP, this library shares the process's runtime (torch's, loaded first under the
         * same soname): its threads are the ones the compiled graph's loops just used, already awake. */
#pragma omp parallel num_threads(threads)
        worker(&job);
#else
        pthread_t helpers[64];
        int32_t started = 0;
        for (; started < threads - 1 && started < 64; started++)
            if (pthread_create(&helpers[started], NULL, worker, &job) != 0) break;
        worker(&job);
        for (int32_t i = 0; i < started; i++) pthread_join(helpers[i], NULL);
#endif
    }
    free(row_request);
    free(block_row);
    return atomic_load(&job.failed);
}
