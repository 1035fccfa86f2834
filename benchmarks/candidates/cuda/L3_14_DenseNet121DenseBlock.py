"""DenseNet121 dense block (KernelBench L3_14), eval mode: L layers of BatchNorm2d -> ReLU -> Conv2d 3x3 ->
Dropout (identity in eval), each fed the concatenation of the input and all earlier layers' outputs.

One output buffer out (N, C0 + L*g, H, W) is allocated once and every feature is written into its
channel slice exactly once: eager instead re-concatenates all features before every layer (and once
more at the end), then runs batch norm and the in-place ReLU as two more passes. Here, per layer, one
kernel (bnrelu_v4 / bnrelu_v1) reads the layer's input channels (the channels already in out, plus
the previous layer's conv output, which it also copies into out: the copy costs no extra read) and
writes z = relu(bn(input)) (contiguous NCHW, per-channel scale from the running statistics); layer 0
copies x into out the same way. The conv is F.conv2d(z, conv.weight, None, stride, padding,
dilation, groups), the very call nn.Conv2d makes, on an input of the same shape, dtype and layout
(contiguous NCHW) as eager's relu(bn(cat)), so cuDNN picks the same (TF32) algorithm and the conv
output bits are eager's whenever z's bits are. The last layer's output is copied into out by copy_().

z = relu(fmaf(weight * (x - mean), rsqrtf(var + eps), bias)) in float: on an H100 (torch 2.11, cuDNN 9.19)
this gave the same bits as eager's eval batch norm (cuDNN's, which at::_select_batch_norm_backend picks for
CUDA float32, and the native kernel alike: gamma * (x - mean) * invstd + beta) on all 9.6M values of a
random test, where 1 / sqrtf, double invstd or (x - mean) * invstd * w + b differed in 17-58% of them.
Should another cuDNN round differently, z differs by an ulp and the conv output by about TF32's own
rounding, which the proof's tolerance (2x eager's error against float64) admits.

Checked on an H100 (torch 2.11 + cuDNN 9.19, kernels launched through CuPy, not this package's launcher;
2026-11-25): output bit-identical to eager, NaN/Inf positions included, at N=1, 10 (224 x 224), N=2
(37 x 41), N=3 (30 x 30). GPU time per call at N=1 from the profiler: about 615 us of kernels against
eager's 946 us (eager: cuDNN bn 45 us + cat 18 us + relu 11 us a layer; here bnrelu_v4 18 us a layer;
the convs, about 500 us, are the same kernels in both). Not timed through metal_accel's own launcher.
"""
SOURCE = r"""
// relu(bn(v)) of one value, in eager's arithmetic: PyTorch's CUDA eval batch norm computes
// gamma * (x - mean) * invstd + beta with invstd = rsqrt(var + eps) in float (cuDNN gives the same bits),
// i.e. fmaf(gamma * (x - mean), invstd, beta). NaN propagates as in eager's ReLU (clamp_min keeps NaN).
__device__ __forceinline__ float bn_relu(float v, float m, float inv, float w, float b) {
    const float y = fmaf(w * (v - m), inv, b);
    return y != y ? y : fmaxf(y, 0.0f);
}

__device__ __forceinline__ float bn_inv(float var, float eps) { return rsqrtf(var + eps); }

// One layer's input is N x Cin planes of L floats: channel c < Cp of image n is plane (n, c) of out
// (N x Ctot planes, already written), channel c >= Cp is plane (n, c - Cp) of src (N x (Cin - Cp)
// planes), which is also copied to plane (n, c) of out. z: N x Cin planes, relu(bn(input)).
// Grid: x over float4s of a plane, y over planes (n, c) with a stride loop.
extern "C" __global__ void __launch_bounds__(256) bnrelu_v4(float4* out, const float4* __restrict__ src,
        float4* __restrict__ z, const float* __restrict__ rm, const float* __restrict__ rv,
        const float* __restrict__ w, const float* __restrict__ b, float eps, int P, int L4, int Cin, int Cp,
        int Ctot) {
    const int Cs = Cin - Cp;
    for (int p = blockIdx.y; p < P; p += gridDim.y) {
        const int n = p / Cin, c = p - n * Cin;
        const float m = rm[c], inv = bn_inv(rv[c], eps), ww = w[c], bb = b[c];
        float4* const zp = z + (long long)p * L4;
        float4* const op = out + ((long long)n * Ctot + c) * L4;
        if (c < Cp) {
            for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < L4; j += gridDim.x * blockDim.x) {
                const float4 v = op[j];
                zp[j] = make_float4(bn_relu(v.x, m, inv, ww, bb), bn_relu(v.y, m, inv, ww, bb),
                                    bn_relu(v.z, m, inv, ww, bb), bn_relu(v.w, m, inv, ww, bb));
            }
        } else {
            const float4* const sp = src + ((long long)n * Cs + (c - Cp)) * L4;
            for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < L4; j += gridDim.x * blockDim.x) {
                const float4 v = sp[j];
                op[j] = v;
                zp[j] = make_float4(bn_relu(v.x, m, inv, ww, bb), bn_relu(v.y, m, inv, ww, bb),
                                    bn_relu(v.z, m, inv, ww, bb), bn_relu(v.w, m, inv, ww, bb));
            }
        }
    }
}

// The same, one float a thread (H * W not a multiple of 4, or src not 16-byte aligned).
extern "C" __global__ void __launch_bounds__(256) bnrelu_v1(float* out, const float* __restrict__ src,
        float* __restrict__ z, const float* __restrict__ rm, const float* __restrict__ rv,
        const float* __restrict__ w, const float* __restrict__ b, float eps, int P, int L, int Cin, int Cp,
        int Ctot) {
    const int Cs = Cin - Cp;
    for (int p = blockIdx.y; p < P; p += gridDim.y) {
        const int n = p / Cin, c = p - n * Cin;
        const float m = rm[c], inv = bn_inv(rv[c], eps), ww = w[c], bb = b[c];
        float* const zp = z + (long long)p * L;
        float* const op = out + ((long long)n * Ctot + c) * L;
        if (c < Cp) {
            for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < L; j += gridDim.x * blockDim.x)
                zp[j] = bn_relu(op[j], m, inv, ww, bb);
        } else {
            const float* const sp = src + ((long long)n * Cs + (c - Cp)) * L;
            for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < L; j += gridDim.x * blockDim.x) {
                const float v = sp[j];
                op[j] = v;
                zp[j] = bn_relu(v, m, inv, ww, bb);
            }
        }
    }
}
"""
SHAPE_GENERIC = True
THREADS = 256
MAX_GX = 1024  # blocks along a plane; more loop in the kernel
MAX_GY = 65535


def forward(module, x):
    assert x.dim() == 4 and x.dtype == torch.float32
    nl = len(module.layers)
    last = nl - 1
    assert module.layers[last][2].out_channels == module.layers[0][2].out_channels
    xc = x.contiguous()
    n, c0, h, w = xc.shape
    hw = h * w
    g = module.layers[0][2].out_channels
    ctot = c0 + nl * g
    out = torch.empty((n, ctot, h, w), device=xc.device, dtype=xc.dtype)
    vec = hw % 4 == 0 and xc.storage_offset() % 4 == 0
    src = xc
    new = xc
    for i in range(nl):
        cin = c0 + i * g
        cp = 0 if i == 0 else cin - g
        # the structure the kernel assumes: eval-mode affine BatchNorm2d with running statistics over
        # all cin channels, ReLU, a bias-free 3x3 conv from cin to g channels, Dropout (identity in eval)
        assert not module.layers[i][0].training and module.layers[i][0].num_features == cin
        assert module.layers[i][0].running_mean is not None and module.layers[i][0].running_var is not None
        assert module.layers[i][0].weight is not None and module.layers[i][0].bias is not None
        assert module.layers[i][2].in_channels == cin and module.layers[i][2].out_channels == g
        assert module.layers[i][2].padding_mode == "zeros" and not module.layers[i][3].training
        z = torch.empty((n, cin, h, w), device=xc.device, dtype=xc.dtype)
        P = n * cin
        if vec:
            L4 = hw // 4
            lib.bnrelu_v4(out, src, z, module.layers[i][0].running_mean, module.layers[i][0].running_var,
                          module.layers[i][0].weight, module.layers[i][0].bias, float(module.layers[i][0].eps),
                          P, L4, cin, cp, ctot, grid=(min((L4 + THREADS - 1) // THREADS, MAX_GX), min(P, MAX_GY)),
                          block=(THREADS,))
        else:
            lib.bnrelu_v1(out, src, z, module.layers[i][0].running_mean, module.layers[i][0].running_var,
                          module.layers[i][0].weight, module.layers[i][0].bias, float(module.layers[i][0].eps),
                          P, hw, cin, cp, ctot, grid=(min((hw + THREADS - 1) // THREADS, MAX_GX), min(P, MAX_GY)),
                          block=(THREADS,))
        # bias=False in this block: a conv without bias has no bias tensor in the module view
        new = F.conv2d(z, module.layers[i][2].weight, None, module.layers[i][2].stride,
                       module.layers[i][2].padding, module.layers[i][2].dilation, module.layers[i][2].groups)
        assert new.shape[0] == n and new.shape[1] == g and new.shape[2] == h and new.shape[3] == w
        src = new.contiguous()
    out.narrow(1, ctot - g, g).copy_(src)
    return out
