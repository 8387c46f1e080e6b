// User kernels launched with 2-D and 3-D blocks (LaunchShape::Grid's `block: [x, y, z]`), for
// tests/tl_tape_cuda/user_kernels.rs; only the emulator compiles them (no PTX).

// y = xᵀ for x of `rows` × `cols` (row-major), through a 32 × 33 tile of static shared memory
// (the padding column keeps a GPU's banks apart): blocks of 32 × 8 threads, each thread moving
// four rows of its block's 32 × 32 tile; a grid of ⌈cols/32⌉ × ⌈rows/32⌉ blocks.
extern "C" __global__ void tl_test_transpose_tiled(const float* x, float* y, unsigned int rows,
                                                   unsigned int cols) {
    __shared__ float tile[32][33];
    const unsigned int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (unsigned int j = threadIdx.y; j < 32; j += blockDim.y) {
        const unsigned int r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[j][threadIdx.x] = x[(unsigned long long)r * cols + c];
    }
    __syncthreads();
    for (unsigned int j = threadIdx.y; j < 32; j += blockDim.y) {
        const unsigned int c = c0 + j, r = r0 + threadIdx.x;
        if (r < rows && c < cols) y[(unsigned long long)c * rows + r] = tile[threadIdx.x][j];
    }
}

// Where each thread of a 3-D block is: for the thread of linear id t = x + bx·(y + by·z) in
// block b (linear in the grid), five outputs at 5·(b·threads + t): t computed from threadIdx
// and blockDim, threadIdx.x + 100·threadIdx.y + 10000·threadIdx.z, the sum of t over its warp
// (an xor butterfly), lane 0's t (a broadcast) and t of the lane above (t itself in the warp's
// last lane), so the warps are the runs of 32 linear ids, as on a GPU.
extern "C" __global__ void tl_test_block_coords(float* y) {
    const unsigned int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned int threads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const float v = (float)t;
    float s = v;
    for (int m = 16; m > 0; m /= 2) s += __shfl_xor_sync(0xffffffffu, s, m);
    const float first = __shfl_sync(0xffffffffu, v, 0);
    const float next = __shfl_down_sync(0xffffffffu, v, 1);
    float* out = y + 5ull * (b * threads + t);
    out[0] = v;
    out[1] = (float)(threadIdx.x + 100 * threadIdx.y + 10000 * threadIdx.z);
    out[2] = s;
    out[3] = first;
    out[4] = next;
}
