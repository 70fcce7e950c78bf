// Softmax forward/backward kernels for fp32/fp16/bf16: each row read from HBM once, written once.
// softmax_<dir>_<dtype>.cu include this file; the kernels are in the chapters of softmax/, in the
// order they build on each other:
//
//   common.cuh     constants, types, a 16-byte Chunk, RowPos, the exponential and TimesInv
//   reduce.cuh     row_reduce (warp, CTA, cluster), the split cluster barrier, Exchange
//   chunks.cuh     a chunk's mask (MaskChunk, kept_bits) and packed 16-bit words (Packed)
//   rows.cuh       register rows: softmax_fwd_rows (one-element and direct), softmax_bwd_rows
//   long_rows.cuh  long forward rows in shared memory, on clusters: softmax_fwd_long
//   two_pass.cuh   two-pass kernels of any length: softmax_fwd_block, softmax_bwd_block
//   launch.cuh     the host side: which kernel and shape a row takes, the grid, the entry points
//
// Three designs, by row length and access width:
//
// Register rows (rows.cuh: the backward; the forward of one-element accesses; the direct forward
// of rows in 16-byte chunks up to 16K fp16/bf16 or 512 fp32 columns): each thread holds its share
// of a row in registers, the row spread over up to 512 threads of a CTA and up to 8 CTAs of a
// cluster.
//
// The long forward (long_rows.cuh, softmax_fwd_long): longer rows in 16-byte chunks, copied into
// shared memory (one CTA a row up to 32K fp16/bf16 or 16K fp32 columns, clusters of 2..8 CTAs
// beyond), three passes over it.
//
// Rows longer than the largest configuration (128K columns, or clusters unavailable) take the
// two-pass block kernel (two_pass.cuh), which has no length limit.
//
// Masking: columns at or past kept_prefix (causal modes) are never read and are written as 0; an
// explicit mask is read V bytes per chunk. A row whose every column is masked (or -inf) is written
// as zeros; a NaN poisons its row.
//
// Precision: common.cuh says how each dtype forms the exponential and the final scaling.
#pragma once

#include "softmax/common.cuh"
#include "softmax/reduce.cuh"
#include "softmax/chunks.cuh"
#include "softmax/rows.cuh"
#include "softmax/long_rows.cuh"
#include "softmax/two_pass.cuh"
#include "softmax/launch.cuh"
