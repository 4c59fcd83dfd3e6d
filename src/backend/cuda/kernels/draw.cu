// The `draw` family: a sampled token of one row drawn on the device exactly as the host's sampler
// draws it (src/sampler.rs and sampler/passes.rs; the CPU kernel is that sampler), so the
// same generator state and settings give the same token, then kept as argmax_advance_f32 keeps
// the greedy one.
//
// draw_advance_f32: arguments x (one row [n]), ring (i32 [R]), inputs (i32 [1 + 2B]), state (u32
// [9]: the generator's two words, top_k, the penalty window's length W, the history's length h,
// then the bits of temperature, top_p, min_p and the penalty), window (i32 [1024]: history token
// j at j % W), scratch (u32 [DR_SCRATCH(n)]: three lists of candidates' keys, as u64, then their
// quanta), n (at most 2^19). One block of 1024 threads.
//
// What it computes, as the sampler: each logit, penalized when its id is among the window's
// (x > 0 ? x / penalty : x * penalty), divided by the temperature (1 when it is 0), is a value;
// the top one (highest, then lowest id) is the greedy token. Otherwise each finite value weighs
// w = exp_weight(v - max) (the same polynomial, each operation rounded alike: no contraction into
// FMAs), dropped below min_p, as the integer quantum floor(w * 2^30); the candidates are those of
// a quantum above 0. Rank order is value down, then id up: the 64-bit key (~value key) << 32 | id
// ascending. With 0 < top_k < candidates the total is the top k's quanta, else all of them; with
// top_p < 1 the nucleus ends at the candidate holding ceil(top_p * total) - 1; the token is the
// candidate whose span of the cumulative quanta holds floor(bits * nucleus / 2^53), bits being the
// generator's next 53 bits. Every sum is an integer sum, so the order the threads add in does
// not matter.
//
// How: a pass for the top value, a pass that writes the candidates (key, quantum) to scratch,
// then each point is found among them: up to 1024 candidates are sorted in shared memory once and
// scanned; more are first narrowed by 8-bit digits of the key (histograms of quanta and counts;
// each pass copies the run the pass before kept to the next list) until at most 1024 remain.

#define DR_THREADS 1024
#define DR_CAP 1024
#define DR_SET 2048
#define DR_WINDOW 1024
#define DR_STATE_WORDS 9
#define DR_BINS 256
#define DR_DIGIT 8
#define DR_GROUPS 4
// The longest row: a histogram's sums of the 15-bit halves of quanta stay within 32 bits.
#define DR_MAX_N (1u << 19)
// The error record's code for a point past every candidate (the prelude's OP_ERR_* codes go on
// here; fault.rs mirrors it): value the nucleus, bound the kept quanta, index the candidates.
#define OP_ERR_DRAW 8
// The scratch words a row takes: 9n, rounded up to even so that each row's u64 keys stay aligned.
#define DR_SCRATCH(n) ((9ull * (n) + 1) & ~1ull)

// e^x for x = value - max <= 0, as `exp_weight` in sampler/passes.rs, operation for operation.
__device__ __forceinline__ float dr_exp_weight(float x) {
    const bool low = isnan(x) || x < -87.0f;
    x = low ? -87.0f : x;
    const float shifted = __fadd_rn(__fmul_rn(x, __int_as_float(0x3fb8aa3b)), 12582912.0f);
    const float k = __fsub_rn(shifted, 12582912.0f);
    const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(k, __int_as_float(0x3f317200))),
                              __fmul_rn(k, __int_as_float(0x35bfbe8e)));
    float p = __fadd_rn(__int_as_float(0x3c088889), __fmul_rn(r, __int_as_float(0x3ab60b61)));
    p = __fadd_rn(__int_as_float(0x3d2aaaab), __fmul_rn(r, p));
    p = __fadd_rn(__int_as_float(0x3e2aaaab), __fmul_rn(r, p));
    p = __fadd_rn(0.5f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f, __fmul_rn(r, p));
    const int ki = __float_as_int(shifted) - 0x4B400000;
    const float w = __fmul_rn(p, __int_as_float((ki + 127) << 23));
    return low ? 0.0f : w;
}

// floor(w * 2^30), clamped into [0, 2^30] (NaN to 2^30), as `quantum`.
__device__ __forceinline__ uint32_t dr_quantum(float w) {
    const float one = 1073741824.0f;
    float y = __fmul_rn(w, one);
    y = y < one ? y : one;
    y = y > 0.0f ? y : 0.0f;
    return (uint32_t)__float2int_rz(y);
}

// The value's key as an unsigned number in total order (finite values only).
__device__ __forceinline__ uint32_t dr_ukey(float v) {
    const int32_t b = __float_as_int(v);
    return (uint32_t)(b ^ (int32_t)((uint32_t)(b >> 31) >> 1)) ^ 0x80000000u;
}

// The value of a key from dr_ukey.
__device__ __forceinline__ float dr_unkey(uint32_t u) {
    const int32_t k = (int32_t)(u ^ 0x80000000u);
    return __int_as_float(k ^ (int32_t)((uint32_t)(k >> 31) >> 1));
}

// The generator's next 53 bits (splitmix64, as `Sampler::next_bits`).
__device__ __forceinline__ uint64_t dr_next_bits(uint64_t& s) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z >> 11;
}

// ceil(p * total) exactly for p in (0, 1) (`share`).
__device__ __forceinline__ uint64_t dr_share(float p, uint64_t total) {
    const uint32_t bits = __float_as_uint(p);
    const int e = (int)(bits >> 23);
    const uint64_t f = bits & 0x7FFFFFu;
    const uint64_t m = e == 0 ? f : (f | 0x800000u);
    const int shift = e == 0 ? 149 : 150 - e;
    const uint64_t lo = m * total, hi = __umul64hi(m, total);
    if (shift >= 128) return (lo | hi) != 0 ? 1 : 0;
    uint64_t q, rem;
    if (shift >= 64) {
        const int s = shift - 64;
        q = hi >> s;
        rem = (s == 0 ? 0 : (hi & ((1ull << s) - 1))) | lo;
    } else {
        q = (hi << (64 - shift)) | (lo >> shift);
        rem = lo & ((1ull << shift) - 1);
    }
    return q + (rem != 0 ? 1 : 0);
}

// floor(k / 2^53 * total) exactly (`point`).
__device__ __forceinline__ uint64_t dr_point(uint64_t k, uint64_t total) {
    return (__umul64hi(k, total) << 11) | ((k * total) >> 53);
}

// The penalty window's ids, a set in shared memory (open addressing; -1 is empty).
__device__ __forceinline__ uint32_t dr_slot(uint32_t id) { return (id * 2654435761u) >> 21; }

__device__ __forceinline__ bool dr_in_set(const int32_t* set, uint32_t id) {
    for (uint32_t s = dr_slot(id);; s = (s + 1) & (DR_SET - 1)) {
        const int32_t e = set[s];
        if (e == (int32_t)id) return true;
        if (e < 0) return false;
    }
}

// Logit i as a value: penalized when in the set, over the temperature.
__device__ __forceinline__ float dr_value(const float* x, uint32_t i, const int32_t* set,
                                          bool penalize, float t, float penalty) {
    const float xv = x[i];
    if (penalize && dr_in_set(set, i)) {
        const float p = xv > 0.0f ? __fdiv_rn(xv, penalty) : __fmul_rn(xv, penalty);
        return __fdiv_rn(p, t);
    }
    return __fdiv_rn(xv, t);
}

// A block-wide sum (OP 0), maximum (1) or minimum (2), left in every thread; 32 warps.
template <int OP>
__device__ __forceinline__ uint64_t dr_combine(uint64_t a, uint64_t b) {
    return OP == 0 ? a + b : OP == 1 ? (a > b ? a : b) : (a < b ? a : b);
}
template <int OP>
__device__ uint64_t dr_reduce(uint64_t v, uint64_t* slots) {
    for (int o = 16; o > 0; o >>= 1) v = dr_combine<OP>(v, __shfl_xor_sync(ONEPASS_FULL_MASK, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = v;
    __syncthreads();
    v = slots[0];
    for (int w = 1; w < DR_THREADS / 32; ++w) v = dr_combine<OP>(v, slots[w]);
    return v;
}

// Sorts the 1024 keys (and their quanta) of shared memory ascending: a bitonic network, a pair a
// thread a stage.
__device__ void dr_sort(uint64_t* sk, uint32_t* sq) {
    const uint32_t i = threadIdx.x;
    for (uint32_t k = 2; k <= DR_CAP; k <<= 1) {
        for (uint32_t j = k >> 1; j > 0; j >>= 1) {
            const uint32_t p = i ^ j;
            if (p > i) {
                const bool up = (i & k) == 0;
                const uint64_t a = sk[i], b = sk[p];
                if ((a > b) == up) {
                    sk[i] = b;
                    sk[p] = a;
                    const uint32_t qa = sq[i];
                    sq[i] = sq[p];
                    sq[p] = qa;
                }
            }
            __syncthreads();
        }
    }
}

// Thread t's inclusive sum of the quanta of the sorted positions 0..=t.
__device__ uint64_t dr_scan(uint64_t q, uint64_t* slots) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint64_t v = q;
    for (int o = 1; o < 32; o <<= 1) {
        const uint64_t t = __shfl_up_sync(ONEPASS_FULL_MASK, v, o);
        if (lane >= (uint32_t)o) v += t;
    }
    __syncthreads();
    if (lane == 31) slots[warp] = v;
    __syncthreads();
    for (uint32_t w = 0; w < warp; ++w) v += slots[w];
    return v;
}

// Copies the entries of the list (k, q: len of them) that `keep` accepts into the shared arrays
// (padded with keys past every key), sorts them and returns thread t's inclusive sum of the sorted
// quanta; at most DR_CAP may be kept. `count` is a shared counter.
template <class Keep>
__device__ uint64_t dr_collect(const uint64_t* k, const uint32_t* q, uint32_t len, Keep keep,
                               uint64_t* sk, uint32_t* sq, uint32_t* count, uint64_t* slots) {
    const uint32_t tid = threadIdx.x, lane = tid & 31;
    __syncthreads();
    if (tid == 0) *count = 0;
    sk[tid] = ~0ull;
    sq[tid] = 0;
    __syncthreads();
    for (uint32_t base = 0; base < len; base += DR_THREADS) {
        const uint32_t j = base + tid;
        const bool in = j < len && keep(k[j]);
        const uint32_t mine = __ballot_sync(ONEPASS_FULL_MASK, in);
        uint32_t at = 0;
        if (lane == 0 && mine != 0) at = atomicAdd(count, __popc(mine));
        at = __shfl_sync(ONEPASS_FULL_MASK, at, 0) + __popc(mine & ((1u << lane) - 1));
        if (in) {
            sk[at] = k[j];
            sq[at] = q[j];
        }
    }
    __syncthreads();
    dr_sort(sk, sq);
    return dr_scan(sq[threadIdx.x], slots);
}

// What a search found: the candidate's key and quantum, and the quanta ranked before it.
struct DrFound {
    uint64_t key;
    uint64_t q;
    uint64_t before;
    uint32_t found;
};

// What a draw gives its kernel: the token (-1 where no value is finite) and the generator after
// it, the same in every thread; `ok` false where it recorded a fault (nothing may be written).
struct DrOutcome {
    int32_t id;
    uint64_t rng;
    bool ok;
};

// Draws from the row x of n values with the settings and generator of the state words and the
// penalty window's tokens (read, not written: dr_keep keeps the outcome). Every thread of the
// block calls it and gets the outcome.
__device__ DrOutcome dr_draw(const float* x, const uint32_t* state, const int32_t* window,
                             uint32_t* scratch, uint32_t n, uint32_t tag) {
    __shared__ int32_t set[DR_SET];
    __shared__ uint64_t sk[DR_CAP];
    __shared__ uint32_t sq[DR_CAP];
    __shared__ uint32_t hlo[DR_GROUPS][DR_BINS];
    __shared__ uint32_t hhi[DR_GROUPS][DR_BINS];
    __shared__ uint32_t hc[DR_GROUPS][DR_BINS];
    __shared__ uint32_t pick_d, pick_ok;
    __shared__ uint64_t pick_rest, pick_before;
    __shared__ uint64_t bw[DR_BINS];
    __shared__ uint32_t bc[DR_BINS];
    __shared__ uint64_t slots[DR_THREADS / 32];
    __shared__ uint32_t count;
    __shared__ DrFound res;
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    uint64_t rng = (uint64_t)state[0] | ((uint64_t)state[1] << 32);
    const uint32_t top_k = state[2], wlen = state[3], hist = state[4];
    const float temperature = __uint_as_float(state[5]), top_p = __uint_as_float(state[6]);
    const float min_p = __uint_as_float(state[7]), penalty = __uint_as_float(state[8]);
    if (wlen > DR_WINDOW) {
        if (tid == 0) op_fail(tag, OP_ERR_SHAPE, __LINE__, wlen, DR_WINDOW);
        return DrOutcome{-1, rng, false};
    }
    const bool penalize = penalty != 1.0f;
    const float t = temperature == 0.0f ? 1.0f : temperature;
    if (penalize) {
        for (uint32_t s = tid; s < DR_SET; s += DR_THREADS) set[s] = -1;
        __syncthreads();
        const uint32_t seen = hist < wlen ? hist : wlen;
        if (tid < seen) {
            const int32_t id = window[tid];
            if (id >= 0 && (uint32_t)id < n) {
                for (uint32_t s = dr_slot((uint32_t)id);; s = (s + 1) & (DR_SET - 1)) {
                    const int32_t prev = atomicCAS(&set[s], -1, id);
                    if (prev < 0 || prev == id) break;
                }
            }
        }
        __syncthreads();
    }

    // The top value: the highest key, then the lowest id.
    uint64_t best = 0;
    for (uint32_t i = tid; i < n; i += DR_THREADS) {
        const float v = dr_value(x, i, set, penalize, t, penalty);
        if (isfinite(v)) {
            const uint64_t c = ((uint64_t)dr_ukey(v) << 32) | (0xFFFFFFFFu - i);
            best = c > best ? c : best;
        }
    }
    best = dr_reduce<1>(best, slots);
    int32_t id = -1;
    if (best != 0 && temperature == 0.0f) {
        id = (int32_t)(0xFFFFFFFFu - (uint32_t)best);
    } else if (best != 0) {
        const float max_v = dr_unkey((uint32_t)(best >> 32));
        const uint64_t bits = dr_next_bits(rng);
        // The candidates' list and two lists for the narrowing passes: keys at words 0, 2n and
        // 4n, quanta at 6n, 7n and 8n.
        uint64_t* keys = (uint64_t*)scratch;
        uint32_t* quanta = scratch + 6ull * n;
        // The candidates, in any order: key and quantum.
        if (tid == 0) count = 0;
        __syncthreads();
        uint64_t sum = 0, kmin = ~0ull, kmax = 0;
        for (uint32_t base = 0; base < n; base += DR_THREADS) {
            const uint32_t i = base + tid;
            uint32_t q = 0;
            uint64_t key = 0;
            if (i < n) {
                const float v = dr_value(x, i, set, penalize, t, penalty);
                // Below e^-21 of the top a weight's quantum is 0 (2^-30 is e^-20.8): no exp.
                const float below = __fsub_rn(v, max_v);
                if (isfinite(v) && below >= -21.0f) {
                    const float w = dr_exp_weight(below);
                    q = w >= min_p ? dr_quantum(w) : 0;
                    key = ((uint64_t)~dr_ukey(v) << 32) | i;
                }
            }
            const uint32_t alive = __ballot_sync(ONEPASS_FULL_MASK, q != 0);
            uint32_t at = 0;
            if (lane == 0 && alive != 0) at = atomicAdd(&count, __popc(alive));
            at = __shfl_sync(ONEPASS_FULL_MASK, at, 0) + __popc(alive & ((1u << lane) - 1));
            if (q != 0) {
                keys[at] = key;
                quanta[at] = q;
                sum += q;
                kmin = key < kmin ? key : kmin;
                kmax = key > kmax ? key : kmax;
            }
        }
        __syncthreads();
        const uint32_t cands = count;
        const uint64_t total = dr_reduce<0>(sum, slots);
        kmin = dr_reduce<2>(kmin, slots);
        kmax = dr_reduce<1>(kmax, slots);
        // Up to DR_CAP candidates: all of them sorted once, each thread holding its position's
        // inclusive sum.
        bool whole = cands <= DR_CAP;
        uint64_t incl = 0;
        if (whole) {
            sk[tid] = tid < cands ? keys[tid] : ~0ull;
            sq[tid] = tid < cands ? quanta[tid] : 0;
            __syncthreads();
            dr_sort(sk, sq);
            incl = dr_scan(sq[tid], slots);
        }
        // The candidate at `target` of the cumulative quanta (or, by_count, the target-th), in
        // rank order: in `res`.
        auto locate = [&](uint64_t target, bool by_count) {
            uint64_t before = 0;
            // The last search's result is read by every thread before it is cleared.
            __syncthreads();
            if (!whole) {
                // Narrow by 8-bit digits below the bits every candidate shares. Each pass sums
                // the quanta and counts of the next digit's runs (shared atomics into one of four
                // histograms; lanes' sums gathered first by __match_any_sync measured slower)
                // over the candidates the pass before kept, copying those to the next list as it
                // reads them; the run that holds the target is kept, until it fits the sort.
                int top = 64 - __clzll(kmin ^ kmax);
                const uint64_t* src_k = keys;
                const uint32_t* src_q = quanta;
                uint32_t held = cands, turn = 1, kept_d = 0;
                int kept_lo = 64;
                uint64_t kept_mask = 0;
                for (;;) {
                    const int lo = top > DR_DIGIT ? top - DR_DIGIT : 0;
                    const uint64_t mask = (1ull << (top - lo)) - 1;
                    for (uint32_t b = tid; b < DR_GROUPS * DR_BINS; b += DR_THREADS) {
                        hlo[b / DR_BINS][b % DR_BINS] = 0;
                        hhi[b / DR_BINS][b % DR_BINS] = 0;
                        hc[b / DR_BINS][b % DR_BINS] = 0;
                    }
                    if (tid == 0) {
                        count = 0;
                        pick_ok = 0;
                    }
                    __syncthreads();
                    uint64_t* dst_k = keys + (uint64_t)n * turn;
                    uint32_t* dst_q = quanta + (uint64_t)n * turn;
                    const bool filter = kept_lo < 64;
                    for (uint32_t base = 0; base < held; base += DR_THREADS) {
                        const uint32_t j = base + tid;
                        uint64_t k = 0;
                        uint32_t q = 0;
                        bool in = j < held;
                        if (in) {
                            k = src_k[j];
                            q = src_q[j];
                            in = !filter || (uint32_t)((k >> kept_lo) & kept_mask) == kept_d;
                        }
                        if (filter) {
                            const uint32_t mine = __ballot_sync(ONEPASS_FULL_MASK, in);
                            uint32_t at = 0;
                            if (lane == 0 && mine != 0) at = atomicAdd(&count, __popc(mine));
                            at = __shfl_sync(ONEPASS_FULL_MASK, at, 0) +
                                 __popc(mine & ((1u << lane) - 1));
                            if (in) {
                                dst_k[at] = k;
                                dst_q[at] = q;
                            }
                        }
                        const uint32_t d = in ? (uint32_t)((k >> lo) & mask) : DR_BINS;
                        if (in) {
                            const uint32_t g = warp % DR_GROUPS;
                            atomicAdd(&hlo[g][d], q & 0x7FFFu);
                            atomicAdd(&hhi[g][d], q >> 15);
                            atomicAdd(&hc[g][d], 1u);
                        }
                    }
                    __syncthreads();
                    if (filter) {
                        src_k = dst_k;
                        src_q = dst_q;
                        held = count;
                        turn = 3 - turn;
                    }
                    if (tid < DR_BINS) {
                        uint64_t w = 0;
                        uint32_t c = 0;
                        for (int g = 0; g < DR_GROUPS; ++g) {
                            w += (uint64_t)hlo[g][tid] + ((uint64_t)hhi[g][tid] << 15);
                            c += hc[g][tid];
                        }
                        bw[tid] = w;
                        bc[tid] = c;
                    }
                    __syncthreads();
                    // The run that holds the target: warp 0 scans the runs, eight a lane.
                    if (warp == 0) {
                        const uint32_t first = lane * (DR_BINS / 32);
                        uint64_t size = 0, mass = 0;
                        for (uint32_t d = first; d < first + DR_BINS / 32; ++d) {
                            size += by_count ? bc[d] : bw[d];
                            mass += bw[d];
                        }
                        uint64_t upto = size, mass_upto = mass;
                        for (int o = 1; o < 32; o <<= 1) {
                            const uint64_t t = __shfl_up_sync(ONEPASS_FULL_MASK, upto, o);
                            const uint64_t m = __shfl_up_sync(ONEPASS_FULL_MASK, mass_upto, o);
                            if (lane >= (uint32_t)o) {
                                upto += t;
                                mass_upto += m;
                            }
                        }
                        const uint64_t from = upto - size;
                        if (from <= target && target < upto) {
                            uint64_t rest = target - from, skipped = mass_upto - mass;
                            uint32_t d = first;
                            for (; d < first + DR_BINS / 32; ++d) {
                                const uint64_t sz = by_count ? bc[d] : bw[d];
                                if (rest < sz) break;
                                rest -= sz;
                                skipped += bw[d];
                            }
                            pick_d = d;
                            pick_rest = rest;
                            pick_before = skipped;
                            pick_ok = 1;
                        }
                    }
                    __syncthreads();
                    if (pick_ok == 0) break;
                    kept_d = pick_d;
                    target = pick_rest;
                    before += pick_before;
                    kept_lo = lo;
                    kept_mask = mask;
                    top = lo;
                    if (bc[kept_d] <= DR_CAP) break;
                    __syncthreads();
                }
                if (pick_ok == 0) {
                    __syncthreads();
                    if (tid == 0) res.found = 0;
                    __syncthreads();
                    return;
                }
                // The kept run into shared memory, sorted.
                incl = dr_collect(
                    src_k, src_q, held,
                    [&](uint64_t k) { return (uint32_t)((k >> kept_lo) & kept_mask) == kept_d; },
                    sk, sq, &count, slots);
            }
            if (tid == 0) res.found = 0;
            __syncthreads();
            const uint64_t excl = incl - sq[tid];
            const bool here = by_count ? (uint64_t)tid == target
                                       : (excl <= target && target < incl);
            if (here && sq[tid] != 0) {
                res.key = sk[tid];
                res.q = sq[tid];
                res.before = before + excl;
                res.found = 1;
            }
            __syncthreads();
        };
        uint64_t kept = total;
        bool lost = false;
        if (top_k > 0 && top_k < cands) {
            locate(top_k - 1, true);
            lost |= res.found == 0;
            kept = res.before + res.q;
            if (!lost && !whole && top_k <= DR_CAP) {
                // The top k are the candidates up to the k-th key: sorted once, the later
                // searches stay among them.
                const uint64_t last = res.key;
                incl = dr_collect(
                    keys, quanta, cands, [&](uint64_t k) { return k <= last; }, sk, sq, &count,
                    slots);
                whole = true;
            }
        }
        uint64_t nucleus = kept;
        if (!lost && top_p < 1.0f) {
            locate(dr_share(top_p, kept) - 1, false);
            lost |= res.found == 0;
            nucleus = res.before + res.q;
        }
        if (!lost) {
            locate(dr_point(bits, nucleus), false);
            lost |= res.found == 0;
        }
        if (lost) {
            if (tid == 0) op_fail(tag, OP_ERR_DRAW, (int64_t)nucleus, kept, cands);
            return DrOutcome{-1, rng, false};
        }
        id = (int32_t)(uint32_t)res.key;
    }
    return DrOutcome{id, rng, true};
}

// Thread 0 keeps a draw's outcome in its state words and window: the generator, and the token
// appended to the penalty's window (history token h at h % W).
__device__ __forceinline__ void dr_keep(uint32_t* state, int32_t* window, const DrOutcome& o) {
    const uint32_t wlen = state[3], hist = state[4];
    state[0] = (uint32_t)o.rng;
    state[1] = (uint32_t)(o.rng >> 32);
    if (o.id >= 0 && wlen != 0) {
        window[hist % wlen] = o.id;
        state[4] = hist + 1;
    }
}

extern "C" __global__ void __launch_bounds__(DR_THREADS) draw_advance_f32(
    const float* x, int32_t* ring, int32_t* inputs, uint32_t* state, int32_t* window,
    uint32_t* scratch, uint32_t n, uint64_t n_x, uint64_t n_ring, uint64_t n_inputs,
    uint64_t n_state, uint64_t n_window, uint64_t n_scratch) {
    OP_GRID_ENTRY();
    const uint32_t tag = op_tag("draw_advance_f32");
    OP_REQUIRE(n != 0 && n_x == n && n_ring != 0 && n_inputs >= 3 && n_inputs % 2 == 1 &&
               n <= DR_MAX_N && n_state == DR_STATE_WORDS && n_window == DR_WINDOW && n_scratch == DR_SCRATCH(n) &&
               blockDim.x == DR_THREADS && blockDim.y == 1 && blockDim.z == 1);
    if (blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0) return;
    const DrOutcome o = dr_draw(x, state, window, scratch, n, tag);
    if (!o.ok || threadIdx.x != 0) return;
    const int32_t id = o.id;
    const int32_t s = inputs[0];
    if (s < 0 || s == 0x7fffffff) {
        op_fail(tag, OP_ERR_POS0, s, 0x7fffffffu, 1);
        return;
    }
    dr_keep(state, window, o);
    const int32_t next = s + 1;
    ring[(uint64_t)s % n_ring] = id;
    inputs[0] = next;
    inputs[1] = id < 0 ? 0 : id;
    inputs[1 + n_inputs / 2] = next;
}

// draw_rows_f32: a token drawn from each row of x ([rows, n]) with that row's state words (u32
// [rows, 9]), window (i32 [rows, 1024]) and scratch (u32 [rows, DR_SCRATCH(n)]), each kept as
// draw_advance keeps its own, the token in out (i32 [rows]). A block of 1024 threads a row.
extern "C" __global__ void __launch_bounds__(DR_THREADS) draw_rows_f32(
    const float* x, uint32_t* state, int32_t* window, uint32_t* scratch, int32_t* out, uint32_t n,
    uint64_t n_x, uint64_t n_state, uint64_t n_window, uint64_t n_scratch, uint64_t n_out) {
    OP_GRID_ENTRY();
    const uint32_t tag = op_tag("draw_rows_f32");
    const uint64_t rows = n_out;
    OP_REQUIRE(n != 0 && n <= DR_MAX_N && rows != 0 && n_x == rows * n &&
               n_state == rows * DR_STATE_WORDS && n_window == rows * DR_WINDOW &&
               n_scratch == rows * DR_SCRATCH(n) && blockDim.x == DR_THREADS && blockDim.y == 1 &&
               blockDim.z == 1);
    const uint64_t r = blockIdx.x;
    if (r >= rows || blockIdx.y != 0 || blockIdx.z != 0) return;
    uint32_t* st = state + r * DR_STATE_WORDS;
    int32_t* win = window + r * DR_WINDOW;
    const DrOutcome o = dr_draw(x + r * n, st, win, scratch + r * DR_SCRATCH(n), n, tag);
    if (!o.ok || threadIdx.x != 0) return;
    dr_keep(st, win, o);
    out[r] = o.id;
}
