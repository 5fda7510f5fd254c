/* Every decoder layer of a decode step in one call from Python, for both families: Llama's and GPT-2's.
 *
 * Why? At batch 1 a SmolLM2-shaped layer runs eleven operations: two RMSNorms, four projections,
 * RoPE, attention, silu(gate) * up and two residual adds. Each is a C kernel or a small torch
 * operator, and each costs Python 5-20 us around it: the interpreter's own code and data are swept
 * out of the caches by the megabytes of weights the projection before it streamed. Thirty layers
 * made that about a quarter of a step whose weights stream in about 15 ms. Here Python calls once
 * a step, and this loop calls the same kernels in the same order on the same buffers, so a Llama
 * step's numbers are bit for bit those of the layer-by-layer path (models/fused_decode.py); GPT-2's
 * differ only where this loop's LayerNorm (pointwise.c) rounds otherwise than torch's.
 *
 * This file holds no arithmetic of its own: every operation, the residual add included, is a
 * function of another kernel library (linear_f32.c or linear_bf16.c, pointwise.c, paged_decode.c),
 * handed over as a pointer, so each kernel keeps its one home and its own build for this CPU.
 *
 * The two families' layers, x the residual stream:
 * - Llama: x += o(attention(rope(qkv(rms_norm(x))))); x += down(silu(gate) * up), [gate | up] = gate_up(rms_norm(x)).
 * - GPT-2: x += c_proj(attention(c_attn(layer_norm(x)))); x += c_proj(gelu(c_fc(layer_norm(x)))), the GELU
 *   inside c_fc's kernel, every projection and norm with a bias.
 *
 * Arguments:
 * - fns: the kernels, in the order of enum fn below (the norm: rms_norm or layer_norm by family).
 * - layers: [n_layer][LAYER_FIELDS] addresses of each layer's weights (packed as its kernel reads),
 *   0 for a bias the layer does not have.
 * - dims: enum dim below. buffers: enum buffer below, each [rows][width] contiguous.
 * - step: cos and signed_sin [rows][head_dim] (Llama's; unread for GPT-2), the new tokens' slots
 *   (int64), the block tables [rows][max_blocks] and context lengths (int32), and layer 0's K and V
 *   caches; layer l's are cache_layer_bytes further on.
 * Returns 0, the attention kernel's status bits (a bad slot or block table: nothing of that layer
 * was read), or STATUS_LINEAR where a projection refused its shapes.
 */
#include <stdint.h>

enum fn { FN_LINEAR, FN_NORM, FN_ROPE, FN_SILU_MUL, FN_ADD, FN_ATTENTION, FN_COUNT };
enum layer {
    W_INPUT_NORM, B_INPUT_NORM, W_QKV, B_QKV, W_O, B_O, W_POST_NORM, B_POST_NORM, W_UP, B_UP, W_DOWN, B_DOWN,
    LAYER_FIELDS
};
enum dim {
    D_LAYERS, D_ROWS, D_EMBD, D_HEADS, D_KV_HEADS, D_HEAD_DIM, D_INTER, D_BLOCK_SIZE, D_MAX_BLOCKS, D_NUM_SLOTS,
    D_CACHE_LAYER_BYTES, D_SEQ_PARTS, D_HEAD_GROUP, D_THREADS, D_ATTENTION_THREADS, D_BF16, D_FAMILY, D_COUNT
};
enum family { LLAMA, GPT2 };
enum buffer { X, NORMED, QKV, ATTENDED, UP, ACTIVATED, PROJECTED, BUFFER_COUNT };
enum step { COS, SIGNED_SIN, SLOTS, TABLES, LENS, K_CACHE, V_CACHE, STEP_COUNT };
#define STATUS_LINEAR 256

typedef int (*linear_fn)(const void *x, int64_t x_stride, const void *packed, const float *bias, int gelu, void *y,
                         int64_t M, int64_t N, int64_t K, int64_t threads);
typedef void (*rms_norm_fn)(const void *x, int64_t x_stride, const void *w, float eps, void *y, int64_t rows,
                            int64_t dim, int64_t threads);
typedef void (*layer_norm_fn)(const void *x, int64_t x_stride, const void *w, const void *b, float eps, void *y,
                              int64_t rows, int64_t dim, int64_t threads);
typedef void (*rope_fn)(void *x, int64_t x_stride, int64_t heads, int64_t head_dim, const void *cos,
                        const void *signed_sin, int64_t rows);
typedef void (*silu_mul_fn)(const void *gate_up, int64_t stride, int64_t inter, void *y, int64_t rows,
                            int64_t threads);
typedef void (*add_fn)(void *x, const void *y, int64_t n);
typedef int (*attention_fn)(const void *q, const void *new_k, const void *new_v, const int64_t *slots,
                            int64_t in_stride, int64_t num_slots, void *k_cache, void *v_cache,
                            const int32_t *block_tables, const int32_t *context_lens, void *out, int64_t num_seqs,
                            int64_t seq_parts, int64_t head_group, int64_t threads, int64_t num_heads,
                            int64_t num_kv_heads, int64_t head_dim, int64_t block_size, int64_t max_blocks,
                            float scale);

int decode_layers(void *const *fns, const int64_t *layers, const int64_t *dims, void *const *buffers,
                  void *const *step, float eps, float scale) {
    const linear_fn linear = (linear_fn)fns[FN_LINEAR];
    const rope_fn rope = (rope_fn)fns[FN_ROPE];
    const silu_mul_fn silu_mul = (silu_mul_fn)fns[FN_SILU_MUL];
    const add_fn add = (add_fn)fns[FN_ADD];
    const attention_fn attention = (attention_fn)fns[FN_ATTENTION];
    const int64_t rows = dims[D_ROWS], embd = dims[D_EMBD], heads = dims[D_HEADS], kv_heads = dims[D_KV_HEADS];
    const int64_t head_dim = dims[D_HEAD_DIM], inter = dims[D_INTER], threads = dims[D_THREADS];
    const int64_t q_width = heads * head_dim, qkv_width = (heads + 2 * kv_heads) * head_dim;
    const int bf16 = dims[D_BF16] != 0, gpt2 = dims[D_FAMILY] == GPT2;
    const int64_t elem = bf16 ? 2 : 4, up_width = gpt2 ? inter : 2 * inter; /* Llama's gate and up, side by side */
    char *const qkv = buffers[QKV];
#define NORM(W, B)                                                                                                  \
    (gpt2 ? ((layer_norm_fn)fns[FN_NORM])(buffers[X], embd, (const void *)w[W], (const void *)w[B], eps,            \
                                           buffers[NORMED], rows, embd, threads)                                    \
          : ((rms_norm_fn)fns[FN_NORM])(buffers[X], embd, (const void *)w[W], eps, buffers[NORMED], rows, embd,     \
                                        threads))
    for (int64_t l = 0; l < dims[D_LAYERS]; ++l) {
        const int64_t *w = layers + l * LAYER_FIELDS;
        char *const k_cache = (char *)step[K_CACHE] + l * dims[D_CACHE_LAYER_BYTES];
        char *const v_cache = (char *)step[V_CACHE] + l * dims[D_CACHE_LAYER_BYTES];
        int status = 0;
        NORM(W_INPUT_NORM, B_INPUT_NORM);
        status |= linear(buffers[NORMED], embd, (const void *)w[W_QKV], (const float *)w[B_QKV], 0, qkv, rows,
                         qkv_width, embd, threads);
        if (!gpt2) rope(qkv, qkv_width, heads + kv_heads, head_dim, step[COS], step[SIGNED_SIN], rows); /* q, k */
        const int attended = attention(qkv, qkv + q_width * elem, qkv + (q_width + kv_heads * head_dim) * elem,
                                       step[SLOTS], qkv_width, dims[D_NUM_SLOTS], k_cache, v_cache, step[TABLES],
                                       step[LENS], buffers[ATTENDED], rows, dims[D_SEQ_PARTS], dims[D_HEAD_GROUP],
                                       dims[D_ATTENTION_THREADS], heads, kv_heads, head_dim, dims[D_BLOCK_SIZE],
                                       dims[D_MAX_BLOCKS], scale);
        if (attended) return attended;
        status |= linear(buffers[ATTENDED], q_width, (const void *)w[W_O], (const float *)w[B_O], 0,
                         buffers[PROJECTED], rows, embd, q_width, threads);
        add(buffers[X], buffers[PROJECTED], rows * embd);
        NORM(W_POST_NORM, B_POST_NORM);
        status |= linear(buffers[NORMED], embd, (const void *)w[W_UP], (const float *)w[B_UP], gpt2, buffers[UP],
                         rows, up_width, embd, threads);
        if (!gpt2) silu_mul(buffers[UP], up_width, inter, buffers[ACTIVATED], rows, threads);
        status |= linear(gpt2 ? buffers[UP] : buffers[ACTIVATED], inter, (const void *)w[W_DOWN],
                         (const float *)w[B_DOWN], 0, buffers[PROJECTED], rows, embd, inter, threads);
        add(buffers[X], buffers[PROJECTED], rows * embd);
        if (status) return STATUS_LINEAR;
    }
#undef NORM
    return 0;
}

/* The enums' sizes, so the caller can check it packs what this file reads. */
int decode_layers_shape(int what) {
    const int sizes[] = {FN_COUNT, LAYER_FIELDS, D_COUNT, BUFFER_COUNT, STEP_COUNT};
    return what >= 0 && what < 5 ? sizes[what] : -1;
}
