"""K in the order Hopper's register operand wants it, so 8-bit weights load 16 bytes at a time.

When a swapped W*A16 kernel multiplies dequantised weights W (N, K) by activations x.T (K, M),
W is the MMA's first operand and wgmma reads it from registers. In that operand's layout (bf16,
16 K values an instruction) the thread at lane 4r + c of a row group holds, of every 16 K
values, the pairs at 2c and 2c + 8. Loaded in K's own order, a thread's 8-bit weights come out
of shared memory two bytes a load: ten instructions a weight value on the H200 (the W8A16
docstring has the ncu figures).

A sum over K does not care in which order its terms come, as long as both operands agree. So
the kernels hand wgmma K reordered: the MMA's K slot 16j + 8h + 2c + l takes the tensor's K
index c * S/4 + 4j + 2h + l (a sub-tile of S values). Thread c then holds K indices c * S/4 to
(c + 1) * S/4 - 1, contiguous in memory, and Triton (3.6, sm_90) carries the operand's layout
back through the reshapes to the shared-memory load: one 16-byte load a thread for every 16
weights (`ld.shared.v4.b32` instead of `ld.shared.v2.b8`), with no layout conversion on the
weights. The activations get the same order in registers before they go to shared memory for
the MMA's second operand. It is the reordering Marlin does to its weights when it quantises
them, done here in the kernel for both operands, so the weights keep their usual layout for
every other kernel.
"""

import triton
import triton.language as tl


@triton.jit
def weights_in_slot_order(w):
    """(N, S) with K along axis 1 -> the same values with K in the MMA's slot order."""
    N: tl.constexpr = w.shape[0]
    S: tl.constexpr = w.shape[1]
    return w.reshape(N, 4, S // 16, 2, 2).permute(0, 2, 3, 1, 4).reshape(N, S)


@triton.jit
def activations_in_slot_order(x_t):
    """(S, M) with K along axis 0 -> the same values with K in the MMA's slot order."""
    S: tl.constexpr = x_t.shape[0]
    M: tl.constexpr = x_t.shape[1]
    return x_t.reshape(4, S // 16, 2, 2, M).permute(1, 2, 0, 3, 4).reshape(S, M)
