// Known answers for flashserve's dequantisers, from ggml itself (an independent implementation,
// built from its public source as an outside tool; see README.md here for the commands).
//
// For each GGUF type it writes, into one safetensors file:
//   <T>.quantized.blocks / .f32  seeded random rows quantised by ggml's own quantiser
//                                (ggml_quantize_chunk) and dequantised by ggml's to_float
//   <T>.random.blocks / .f32     random block bytes (the f16 scale fields forced finite) through
//                                ggml's to_float: every scale, code and sign pattern, not only
//                                those a quantiser picks
// and, as metadata, ggml's commit and the block geometry of every ggml type (name, id, weights
// per block, bytes per block), which flashserve's type table is checked against.
//
// IQ2_XXS has no importance-matrix-free quantiser in ggml (quantize_row_iq2_xxs_impl asserts on
// missing weights), so its rows are quantised with unit importance weights.
//
//   ggml_known_answers OUT.safetensors GGML_COMMIT
#include <ggml.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kRows = 6, kCols = 512 };

static uint64_t rng_state;
static uint64_t next_u64(void) {  // splitmix64
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static float uniform(void) { return (float)((next_u64() >> 40) * (1.0 / 16777216.0)); }
static float gaussian(void) {  // sum of uniforms: enough spread for quantiser inputs
  float s = 0;
  for (int i = 0; i < 6; ++i) s += uniform();
  return (s - 3.0f) * 1.41f;
}

// One tensor of the output file, kept until the header is written.
struct Tensor {
  char name[64];
  const char* dtype;
  int64_t shape[2];
  void* data;
  size_t bytes;
};
static struct Tensor tensors[128];
static int n_tensors;

static void add(const char* name, const char* dtype, int64_t r, int64_t c, const void* data,
                size_t bytes) {
  struct Tensor* t = &tensors[n_tensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dtype = dtype;
  t->shape[0] = r;
  t->shape[1] = c;
  t->data = malloc(bytes);
  memcpy(t->data, data, bytes);
  t->bytes = bytes;
}

// Input rows with the shapes real weights have: plain gaussian rows at several scales, a row
// with outliers, a row of tiny values (f16 scales near their subnormals), an all-zero row.
static void make_rows(float* x) {
  for (int r = 0; r < kRows; ++r) {
    const float scale = (r == 4) ? 1e-6f : powf(10.0f, (float)(r % 3) - 1.5f);
    for (int c = 0; c < kCols; ++c) {
      float v = gaussian() * scale;
      if (r == 3 && c % 97 == 5) v *= 40.0f;
      if (r == 5) v = 0.0f;
      x[r * kCols + c] = v;
    }
  }
}

// Positions of the f16 fields in each type's block (forced finite in random blocks).
static void finite_f16_fields(enum ggml_type t, uint8_t* block) {
  int pos[2] = {-1, -1};
  switch (t) {
    case GGML_TYPE_Q8_0: pos[0] = 0; break;
    case GGML_TYPE_Q2_K: pos[0] = 80; pos[1] = 82; break;
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: pos[0] = 0; pos[1] = 2; break;
    case GGML_TYPE_Q6_K: pos[0] = 208; break;
    case GGML_TYPE_IQ2_XXS: pos[0] = 0; break;
    default: break;
  }
  for (int i = 0; i < 2; ++i) {
    if (pos[i] < 0) continue;
    // sign, exponent below 16 (magnitudes under 2, subnormals included), any mantissa
    const uint16_t h = (uint16_t)(next_u64() & 0xbfff);
    memcpy(block + pos[i], &h, 2);
  }
}

static void upper(char* s) {
  for (; *s; ++s)
    if (*s >= 'a' && *s <= 'z') *s = (char)(*s - 'a' + 'A');
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s OUT.safetensors GGML_COMMIT\n", argv[0]);
    return 2;
  }
  const enum ggml_type types[] = {GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                                  GGML_TYPE_Q2_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                  GGML_TYPE_Q6_K, GGML_TYPE_IQ2_XXS};
  static float x[kRows * kCols], y[kRows * kCols], ones[kCols];
  for (int c = 0; c < kCols; ++c) ones[c] = 1.0f;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; ++i) {
    const enum ggml_type t = types[i];
    char name[32], key[64];
    snprintf(name, sizeof name, "%s", ggml_type_name(t));
    upper(name);
    const size_t row_bytes = ggml_row_size(t, kCols);
    uint8_t* q = malloc(row_bytes * kRows);
    rng_state = 0x5eed0000ull + (uint64_t)t;

    make_rows(x);
    ggml_quantize_init(t);
    const float* imatrix = ggml_quantize_requires_imatrix(t) ? ones : NULL;
    ggml_quantize_chunk(t, x, q, 0, kRows, kCols, imatrix);
    ggml_get_type_traits(t)->to_float(q, y, kRows * kCols);
    snprintf(key, sizeof key, "%s.quantized.blocks", name);
    add(key, "U8", kRows, (int64_t)row_bytes, q, row_bytes * kRows);
    snprintf(key, sizeof key, "%s.quantized.f32", name);
    add(key, "F32", kRows, kCols, y, sizeof y);

    const int64_t blck = ggml_blck_size(t);
    const size_t tsize = ggml_type_size(t);
    for (size_t b = 0; b < row_bytes * kRows; ++b) q[b] = (uint8_t)next_u64();
    if (blck > 1) {
      for (size_t b = 0; b < row_bytes * kRows; b += tsize) finite_f16_fields(t, q + b);
    }
    ggml_get_type_traits(t)->to_float(q, y, kRows * kCols);
    snprintf(key, sizeof key, "%s.random.blocks", name);
    add(key, "U8", kRows, (int64_t)row_bytes, q, row_bytes * kRows);
    snprintf(key, sizeof key, "%s.random.f32", name);
    add(key, "F32", kRows, kCols, y, sizeof y);
    free(q);
  }

  // Geometry of every ggml type that has one: "NAME id block_elements block_bytes;".
  static char geometry[8192];
  size_t used = 0;
  for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
    const struct ggml_type_traits* tr = ggml_get_type_traits((enum ggml_type)t);
    if (tr->blck_size == 0 || strstr(tr->type_name, "REMOVED") || strcmp(tr->type_name, "DEPRECATED") == 0)
      continue;
    char nm[64];
    snprintf(nm, sizeof nm, "%s", tr->type_name);
    upper(nm);
    used += (size_t)snprintf(geometry + used, sizeof geometry - used, "%s %d %lld %zu;", nm, t,
                             (long long)tr->blck_size, tr->type_size);
  }

  // safetensors: u64 header length, JSON header, data.
  static char header[65536];
  size_t h = 0, offset = 0;
  h += (size_t)snprintf(header + h, sizeof header - h,
                        "{\"__metadata__\":{\"ggml_commit\":\"%s\",\"ggml_geometry\":\"%s\"}",
                        argv[2], geometry);
  for (int i = 0; i < n_tensors; ++i) {
    h += (size_t)snprintf(header + h, sizeof header - h,
                          ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                          tensors[i].name, tensors[i].dtype, (long long)tensors[i].shape[0],
                          (long long)tensors[i].shape[1], offset, offset + tensors[i].bytes);
    offset += tensors[i].bytes;
  }
  h += (size_t)snprintf(header + h, sizeof header - h, "}");
  while (h % 8 != 0) header[h++] = ' ';
  FILE* f = fopen(argv[1], "wb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  const uint64_t len = h;
  fwrite(&len, 8, 1, f);
  fwrite(header, 1, h, f);
  for (int i = 0; i < n_tensors; ++i) fwrite(tensors[i].data, 1, tensors[i].bytes, f);
  fclose(f);
  printf("wrote %d tensors, %zu data bytes to %s\n", n_tensors, offset, argv[1]);
  return 0;
}
