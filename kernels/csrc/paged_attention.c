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
    const float *q = job->q + ((int64_t)row * job->hq + (int64_t)h * g_count) * d;

    for (int64_t j = 0; j < visible; j++) {
        const float *k = job->k_pool + (slots[j] * job->hkv + h) * d;
        for (int32_t g = 0; g < g_count; g++) {
            const float *qg = q + (int64_t)g * d;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int32_t i = 0; i < d; i++) dot += qg[i] * k[i];
            scores[(int64_t)g * job->max_kv_len + j] = dot * job->scale;
        }
    }
    memset(acc, 0, sizeof(float) * (size_t)g_count * (size_t)d);
    for (int32_t g = 0; g < g_count; g++) {
        float *s = scores + (int64_t)g * job->max_kv_len;
        float max = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < visible; j++) max = s[j] > max ? s[j] : max;
        for (int64_t j = 0; j < visible; j++) {
            s[j] = expf(s[j] - max);
            sum += s[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < visible; j++) s[j] *= inv;
    }
    for (int64_t j = 0; j < visible; j++) {
        const float *v = job->v_pool + (slots[j] * job->hkv + h) * d;
        for (int32_t g = 0; g < g_count; g++) {
            const float p = scores[(int64_t)g * job->max_kv_len + j];
            float *a = acc + (int64_t)g * d;
#pragma omp simd
            for (int32_t i = 0; i < d; i++) a[i] += p * v[i];
        }
    }
    memcpy(job->out + ((int64_t)row * job->hq + (int64_t)h * g_count) * d, acc,
           sizeof(float) * (size_t)g_count * (size_t)d);
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
    int32_t helpers = num_threads - 1;
    if (helpers > items / ITEMS_PER_GRAB) helpers = (int32_t)(items / ITEMS_PER_GRAB);
    pthread_t threads[64];
    if (helpers > 64) helpers = 64;
    int32_t started = 0;
    for (; started < helpers; started++)
        if (pthread_create(&threads[started], NULL, worker, &job) != 0) break;
    worker(&job);
    for (int32_t i = 0; i < started; i++) pthread_join(threads[i], NULL);
    free(row_request);
    return atomic_load(&job.failed);
}
