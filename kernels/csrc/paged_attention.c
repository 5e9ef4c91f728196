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

typedef struct {
    const float *q, *k_pool, *v_pool;
    const int64_t *qo_indptr, *kv_indptr, *kv_indices;
    const int32_t *row_request;
    float *out;
    int32_t num_rows, hq, hkv, d;
    int64_t max_kv_len;
    float scale;
    atomic_long next_item;
    atomic_int failed;
} Job;

#define ITEMS_PER_GRAB 4
/* Key rows visited (all query rows, all kv heads) below which the call runs on the calling thread alone.
 * It was 16,384 while a helper thread was created per call (a batch-2 decode of the tiny model at KV 200
 * then spent 0.51 ms a layer waiting for it). On the process's OpenMP team, already awake from the
 * compiled graph's loops, a lower bar wins: offline rounds of the tiny model (48 requests, decode batches
 * of ~30 at KV ~250, i.e. ~15,000 visits, were all serial), same process, ABBA over 16 pairs: 2,048
 * against 16,384 a median 1.084x the throughput (14 of 16 above 1); 512 against 2,048 1.006x (8 of 16).
 * A batch-1 decode (2 x its KV length in visits) stays serial up to KV 1,024. */
#define SERIAL_KEY_VISITS 2048
#define PREFETCH_AHEAD 16 /* slots: about a DRAM latency's worth of the loop's work at head dim 32 */

/* Asks for the `floats` floats at `offset` of each of `n` pool rows, ahead of their use (read, keep in
 * every cache level). A request's rows are wherever its slots put them, so the hardware prefetcher cannot
 * guess the next one. One layer of a batch-64 decode (KV 320) read from DRAM, same process, alternating:
 * 1.62 -> 1.29 ms with rows in slot order, 2.88 -> 2.05 ms with rows scattered (as a long-running
 * server's reused slots are). */
static inline void prefetch_rows(const float *pool, const int64_t *slots, int32_t n, int64_t stride, int64_t offset,
                                 int32_t floats) {
    for (int32_t i = 0; i < n; i++) {
        const char *row = (const char *)(pool + slots[i] * stride + offset);
        for (int32_t b = 0; b < floats * (int32_t)sizeof(float); b += 64) __builtin_prefetch(row + b, 0, 3);
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

/* Scores of the G query heads sharing kv head h against `visible` keys:
 * scores[g * pitch + j] = scale * q_g . k_j. Blocks of eight keys, every head per block, so each
 * key row is read from memory once whatever the GQA ratio. */
static inline __attribute__((always_inline)) void score_keys(const float *q, int32_t g_count, const float *k_pool,
                                                             const int64_t *slots, int64_t visible, int64_t stride,
                                                             int64_t h, float scale, float *scores, int64_t pitch,
                                                             const int32_t d, const int prefetch) {
    int64_t j = 0;
#ifdef TL_AVX2
    if (d % 8 == 0) {
        const __m256 vscale = _mm256_set1_ps(scale);
        for (; j + 8 <= visible; j += 8) {
            const float *k[8];
            for (int32_t jj = 0; jj < 8; jj++) k[jj] = k_pool + slots[j + jj] * stride + h * d;
            if (prefetch && j + PREFETCH_AHEAD + 8 <= visible) prefetch_rows(k_pool, slots + j + PREFETCH_AHEAD, 8, stride, h * d, d);
            for (int32_t g = 0; g < g_count; g++) {
                const float *qg = q + (int64_t)g * d;
                __m256 acc[8];
                for (int32_t jj = 0; jj < 8; jj++) {
                    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(qg), _mm256_loadu_ps(k[jj]));
                    for (int32_t i = 8; i < d; i += 8)
                        a = _mm256_fmadd_ps(_mm256_loadu_ps(qg + i), _mm256_loadu_ps(k[jj] + i), a);
                    acc[jj] = a;
                }
                _mm256_storeu_ps(scores + g * pitch + j,
                                 _mm256_mul_ps(sum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]), vscale));
            }
        }
    }
#endif
    for (; j < visible; j++) {
        const float *k = k_pool + slots[j] * stride + h * d;
        for (int32_t g = 0; g < g_count; g++) {
            const float *qg = q + (int64_t)g * d;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int32_t i = 0; i < d; i++) dot += qg[i] * k[i];
            scores[g * pitch + j] = dot * scale;
        }
    }
}

/* s[j] = exp(s[j] - max s) in place; returns the sum. */
static inline float exp_shifted(float *s, int64_t n) {
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

/* `d` is a literal at every call below, so the compiler unrolls and vectorises the head-dim loops. */
static inline __attribute__((always_inline)) void attend_item_d(const Job *job, int64_t item, float *scores,
                                                                float *acc, const int32_t d) {
    const int32_t row = (int32_t)(item / job->hkv), h = (int32_t)(item % job->hkv);
    const int32_t g_count = job->hq / job->hkv;
    const int32_t r = job->row_request[row];
    const int64_t n_new = job->qo_indptr[r + 1] - job->qo_indptr[r];
    const int64_t kv_len = job->kv_indptr[r + 1] - job->kv_indptr[r];
    const int64_t visible = kv_len - n_new + (row - job->qo_indptr[r]) + 1; /* causal */
    const int64_t *slots = job->kv_indices + job->kv_indptr[r];
    const int64_t stride = (int64_t)job->hkv * d;
    const float *q = job->q + ((int64_t)row * job->hq + (int64_t)h * g_count) * d;

    /* A decode row's keys are the request's whole history, mostly out of cache; an extend's were mostly
     * just written by this forward, and asking for them again measured 5-12 % slower. */
    const int prefetch = n_new == 1;
    score_keys(q, g_count, job->k_pool, slots, visible, stride, h, job->scale, scores, job->max_kv_len, d, prefetch);
    float inv_sum[g_count];
    for (int32_t g = 0; g < g_count; g++) inv_sum[g] = 1.0f / exp_shifted(scores + (int64_t)g * job->max_kv_len, visible);
    int summed = 0;
#ifdef TL_AVX2
    summed = weigh_values_fast(job->v_pool, slots, visible, stride, h, scores, job->max_kv_len, acc, d, g_count, prefetch);
#endif
    if (!summed) {
        memset(acc, 0, sizeof(float) * (size_t)g_count * (size_t)d);
        for (int64_t j = 0; j < visible; j++) {
            const float *v = job->v_pool + slots[j] * stride + (int64_t)h * d;
            for (int32_t g = 0; g < g_count; g++) {
                const float p = scores[(int64_t)g * job->max_kv_len + j];
                float *a = acc + (int64_t)g * d;
#pragma omp simd
                for (int32_t i = 0; i < d; i++) a[i] += p * v[i];
            }
        }
    }
    /* Normalised once at the end: the weights' sum scales the d outputs, not every weight. */
    float *out = job->out + ((int64_t)row * job->hq + (int64_t)h * g_count) * d;
    for (int32_t g = 0; g < g_count; g++)
        for (int32_t i = 0; i < d; i++) out[(int64_t)g * d + i] = acc[(int64_t)g * d + i] * inv_sum[g];
}

static void attend_item(const Job *job, int64_t item, float *scores, float *acc) {
    switch (job->d) {
    case 64: attend_item_d(job, item, scores, acc, 64); break;
    case 128: attend_item_d(job, item, scores, acc, 128); break;
    case 32: attend_item_d(job, item, scores, acc, 32); break;
    case 256: attend_item_d(job, item, scores, acc, 256); break;
    default: attend_item_d(job, item, scores, acc, job->d);
    }
}

static void *worker(void *arg) {
    Job *job = (Job *)arg;
    const int32_t g_count = job->hq / job->hkv;
    float *scores = malloc(sizeof(float) * (size_t)g_count * (size_t)job->max_kv_len);
    float *acc = malloc(sizeof(float) * (size_t)g_count * (size_t)job->d);
    if (scores == NULL || acc == NULL) {
        atomic_store(&job->failed, 1);
        free(scores);
        free(acc);
        return NULL;
    }
    const int64_t items = (int64_t)job->num_rows * job->hkv;
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
    if (row_request == NULL) return 1;
    int64_t max_kv_len = 1;
    for (int32_t r = 0; r < num_requests; r++) {
        for (int64_t row = qo_indptr[r]; row < qo_indptr[r + 1]; row++) row_request[row] = r;
        const int64_t len = kv_indptr[r + 1] - kv_indptr[r];
        max_kv_len = len > max_kv_len ? len : max_kv_len;
    }
    Job job = {q, k_pool, v_pool, qo_indptr, kv_indptr, kv_indices, row_request, out,
               num_rows, hq, hkv, d, max_kv_len, scale, 0, 0};
    const int64_t items = (int64_t)num_rows * hkv;
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
    return atomic_load(&job.failed);
}
