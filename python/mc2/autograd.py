"""The fused operators as torch.autograd Functions.

Each Function's backward runs the dual fused operator, so a tensor-parallel
layer built from them has every TP GEMM fused in both directions:

  forward                         input gradient              weight gradient
  all_gather_matmul(a, b)         matmul_reduce_scatter(dc,   gathered_a^T dc, run as the
                                    b^T)                      reduce-scatter's overlap work
  matmul_reduce_scatter(a, b)     all_gather_matmul(dc, b^T)  a^T gathered_dc, after it
  copy_matmul(a, b) (a @ b on a   matmul_all_reduce(dc, b^T)  a^T dc, run as the
    replicated a)                                             all-reduce's overlap work
  matmul_all_reduce(a, b)         dc b^T (local)              a^T dc (local)
  all_gather_batch_matmul(a, b)   a reduce-scatter over the   gathered_a^T dc per entry
                                    batch (below)               (summed for a shared b),
                                                              as overlap work

Gradient convention (Megatron-LM's): a sharded output's gradient is this
rank's part of the whole; a replicated output (matmul_all_reduce's, the
bias and x3 added to it) gets the same gradient on every rank, counted
once. So matmul_all_reduce's backward communicates nothing, and
copy_matmul, which consumes a replicated input, all-reduces its input
gradient. A replicated bias added after matmul_reduce_scatter gets the sum
of every rank's rows (read from the gathered output gradient, no extra
collective).

Operands are f32 or bf16 (the operators compute in f32 or in bf16 with
f32 accumulation); results and gradients are in the operands' dtype.
Weight-gradient GEMMs run in torch, in f32.
"""

import torch
from torch.autograd import Function


def _f32_matmul(x, y, dtype):
    return torch.matmul(x.float(), y.float()).to(dtype)


def _t(x):
    return x.t().contiguous()


class _Overlap:
    """Work handed to an operator as `overlap`: run once inside the call,
    or here if the operator did not run it."""

    def __init__(self, fn):
        self.fn = fn
        self.result = None
        self.done = False

    def __call__(self):
        if not self.done:
            self.done = True
            self.result = self.fn()

    def get(self):
        self()
        return self.result


def _overlap_if(needed, fn):
    return _Overlap(fn) if needed else None


def _save_gathering(ctx, comm, opts, m, c, b, g, need_db):
    """What the backward of a gathering operator (all_gather_matmul,
    all_gather_batch_matmul) needs: b, and the gathered a for b's gradient."""
    ctx.comm, ctx.opts, ctx.m = comm, opts, m
    ctx.out_shape = c.shape
    ctx.save_for_backward(b, g if need_db else None)
    ctx.set_materialize_grads(False)  # an unused gathered copy costs nothing


def _save_product(ctx, comm, opts, a, b, bias):
    """What the backward of a @ b + bias needs: a (for b's gradient, if b
    needs one), b (for a's) and whether there is a bias."""
    ctx.comm, ctx.opts = comm, opts
    ctx.has_bias = bias is not None
    ctx.save_for_backward(a if ctx.needs_input_grad[3] else None, b)


def _gathering_grads(ctx, dc):
    """(b, gathered a, the output gradient (zeros if the output was unused),
    whether a needs a gradient, whether b does), in a gathering operator's
    backward (_save_gathering)."""
    b, g = ctx.saved_tensors
    dc = torch.zeros(ctx.out_shape, dtype=b.dtype) if dc is None else dc.contiguous()
    return b, g, dc, ctx.needs_input_grad[2], ctx.needs_input_grad[3]


class AllGatherMatmul(Function):
    """(gather_rows(a) @ b + bias, gathered a if gather_output else None)."""

    @staticmethod
    def forward(ctx, comm, opts, a, b, bias, gather_output):
        need_db = ctx.needs_input_grad[3]
        c, g = comm.all_gather_matmul(a, b, gather_output=bool(gather_output or need_db),
                                      **opts)
        if bias is not None:
            c += bias.float()
        ctx.has_bias = bias is not None
        _save_gathering(ctx, comm, opts, a.shape[0], c, b, g, need_db)
        return c.to(a.dtype), (g if gather_output else None)

    @staticmethod
    def backward(ctx, dc, dg):
        b, g, dc, need_da, need_db = _gathering_grads(ctx, dc)
        wgrad = _overlap_if(need_db, lambda: _f32_matmul(g.t(), dc, b.dtype))
        da = None
        if need_da:
            lhs, rhs = dc, _t(b)
            if dg is not None:
                # The gathered copy's gradient reduces onto the shard too: one
                # reduce-scatter of [dc | dg] times [b^T ; I].
                eye = torch.eye(b.shape[0], dtype=b.dtype)
                lhs = torch.cat([dc, dg.to(dc.dtype)], dim=1)
                rhs = torch.cat([rhs, eye], dim=0)
            da = ctx.comm.matmul_reduce_scatter(lhs, rhs, ctx.m, overlap=wgrad,
                                                **ctx.opts).to(b.dtype)
        db = wgrad.get() if need_db else None
        dbias = dc.sum(0) if ctx.has_bias and ctx.needs_input_grad[4] else None
        return None, None, da, db, dbias, None


class MatmulReduceScatter(Function):
    """This rank's m_local rows of the sum over ranks of a @ b, + bias."""

    @staticmethod
    def forward(ctx, comm, opts, a, b, m_local, bias):
        c = comm.matmul_reduce_scatter(a, b, m_local, **opts)
        if bias is not None:
            c += bias.float()
        _save_product(ctx, comm, opts, a, b, bias)
        return c.to(a.dtype)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        need_da, need_db = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        need_dbias = ctx.has_bias and ctx.needs_input_grad[5]
        dc = dc.contiguous()
        # The gathered output gradient feeds the weight gradient and the
        # bias's, so the all-gather is needed even when a needs none.
        da, dc_all = ctx.comm.all_gather_matmul(dc, _t(b), gather_output=need_db or need_dbias,
                                                **ctx.opts)
        db = _f32_matmul(a.t(), dc_all, b.dtype) if need_db else None
        dbias = dc_all.sum(0) if need_dbias else None
        return None, None, da.to(b.dtype) if need_da else None, db, None, dbias


class MatmulAllReduce(Function):
    """The sum over ranks of a @ b, + bias + x3, replicated on every rank."""

    @staticmethod
    def forward(ctx, comm, opts, a, b, bias, x3):
        c = comm.matmul_all_reduce(a, b, **opts)
        if bias is not None:
            c += bias.float()
        if x3 is not None:
            c += x3.float()
        ctx.has_bias, ctx.has_x3 = bias is not None, x3 is not None
        ctx.save_for_backward(a, b)
        return c.to(a.dtype)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        g = ctx.needs_input_grad
        da = _f32_matmul(dc, b.t(), a.dtype) if g[2] else None
        db = _f32_matmul(a.t(), dc, b.dtype) if g[3] else None
        dbias = dc.sum(0) if ctx.has_bias and g[4] else None
        dx3 = dc if ctx.has_x3 and g[5] else None
        return None, None, da, db, dbias, dx3


class CopyMatmul(Function):
    """a @ b + bias for a replicated a (the same on every rank) and this
    rank's column block b: Megatron's column-parallel layer without
    sequence parallelism, whose input gradient is all-reduced."""

    @staticmethod
    def forward(ctx, comm, opts, a, b, bias):
        c = torch.matmul(a.float(), b.float())
        if bias is not None:
            c += bias.float()
        _save_product(ctx, comm, opts, a, b, bias)
        return c.to(a.dtype)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        need_da, need_db = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        dc = dc.contiguous()
        wgrad = _overlap_if(need_db, lambda: _f32_matmul(a.t(), dc, b.dtype))
        da = None
        if need_da:
            da = ctx.comm.matmul_all_reduce(dc, _t(b), overlap=wgrad, **ctx.opts).to(b.dtype)
        db = wgrad.get() if need_db else None
        dbias = dc.sum(0) if ctx.has_bias and ctx.needs_input_grad[4] else None
        return None, None, da, db, dbias


def _rows_major(x):
    """[batch, M, w] -> [M * batch, w], the rows of one M index adjacent, so
    that every rank's M range is one contiguous block of rows."""
    return x.transpose(0, 1).reshape(-1, x.shape[2])


class AllGatherBatchMatmul(Function):
    """c[e] = gather_rows(a[e]) @ b[e] (or the shared b) for every entry e;
    the gathered a if gather_output."""

    @staticmethod
    def forward(ctx, comm, opts, a, b, gather_output):
        need_db = ctx.needs_input_grad[3]
        c, g = comm.all_gather_batch_matmul(a, b, gather_output=bool(gather_output or need_db),
                                            **opts)
        _save_gathering(ctx, comm, opts, a.shape[1], c, b, g, need_db)
        return c.to(a.dtype), (g if gather_output else None)

    @staticmethod
    def backward(ctx, dc, dg):
        b, g, dc, need_da, need_db = _gathering_grads(ctx, dc)
        batch, k = dc.shape[0], b.shape[-2]
        shared = b.dim() == 2
        if shared:
            wgrad = _overlap_if(need_db, lambda: _f32_matmul(
                g.reshape(-1, k).t(), dc.reshape(-1, dc.shape[2]), b.dtype))
        else:
            wgrad = _overlap_if(need_db, lambda: torch.bmm(
                g.float().transpose(1, 2), dc.float()).to(b.dtype))
        da = None
        if need_da:
            # Rank r's rows of entry e are rows [off_r, off_r + m_r) of
            # dc[e] b[e]^T summed over ranks; laid out M-major, every rank's
            # rows of all entries are one block, so one reduce-scatter does.
            if shared:
                lhs, rhs = _rows_major(dc), _t(b)
            else:
                # One B per entry: the product is local, and only the sum is
                # left, as a reduce-scatter by the identity (exact).
                lhs = _rows_major(torch.bmm(dc.float(), b.float().transpose(1, 2)))
                rhs = torch.eye(k, dtype=torch.float32)
            if dg is not None:
                lhs = torch.cat([lhs.float(), _rows_major(dg.float())], dim=1)
                rhs = torch.cat([rhs.float(), torch.eye(k, dtype=torch.float32)], dim=0)
            elif lhs.dtype != rhs.dtype:
                lhs, rhs = lhs.float(), rhs.float()
            flat = ctx.comm.matmul_reduce_scatter(lhs.contiguous(), rhs.contiguous(),
                                                  ctx.m * batch, overlap=wgrad, **ctx.opts)
            da = flat.reshape(ctx.m, batch, k).transpose(0, 1).contiguous().to(b.dtype)
        db = wgrad.get() if need_db else None
        return None, None, da, db, None


# ---------------------------------------------------------------- MoE
#
# A routing (mc2.moe_route) fixes who sends which token to which expert;
# received rows are in expert-grouped order (local expert 0's rows first).
#
#   forward                          input gradient                 weight gradient
#   dispatch_matmul(x, w)            matmul_combine(dy, w^T) (the   per expert: dispatched_x^T dy,
#     [T, k] -> [R, n]                 sum over a token's slots)      as overlap work
#   matmul_combine(h, w, probs)      p * dispatch_matmul(dc, w^T)   per expert: h^T (p * dispatched dc)
#     [R, k] -> [T, n]
#
# With gate weights, the expert side needs each received row's weight p
# and the token side each slot's gradient dp = <dc[t], row>: both travel
# as a [T or R, E] matrix whose column e carries the value for expert e,
# moved by the same operators with identity weights (exact). So a token
# must not name one expert twice (top-k routing never does; mc2.moe_route
# checks it).

def _slot_experts(routing):
    """The global expert of each slot this rank sends, and the slots, in
    dispatch order (routing.send_slots is grouped by expert)."""
    E, rank = routing.num_experts, routing.rank
    counts = routing.counts[rank * E:(rank + 1) * E]
    experts = torch.repeat_interleave(torch.arange(E), torch.tensor(counts, dtype=torch.long))
    return experts, torch.tensor(routing.send_slots, dtype=torch.long)


def _received_experts(routing):
    """The global expert of each received row (expert-grouped order)."""
    per = routing.experts_per_rank
    rows = [routing.expert_rows(le) for le in range(per)]
    return torch.repeat_interleave(routing.rank * per + torch.arange(per),
                                   torch.tensor(rows, dtype=torch.long))


def _identity_experts(routing, width):
    return torch.eye(width).expand(routing.experts_per_rank, width, width).contiguous()


def _expert_wgrad(routing, x, dy, dtype):
    """Per local expert: x[rows]^T dy[rows] (x [R, k], dy [R, n])."""
    out, first = [], 0
    for le in range(routing.experts_per_rank):
        rows = routing.expert_rows(le)
        out.append(torch.matmul(x[first:first + rows].float().t(), dy[first:first + rows].float()))
        first += rows
    return torch.stack(out).to(dtype)


def _probs_at_experts(comm, routing, probs, opts):
    """Each received row's gate weight (expert-grouped order)."""
    E, topk = routing.num_experts, routing.topk
    experts, slots = _slot_experts(routing)
    table = torch.zeros(routing.num_tokens, E)
    flat = probs.reshape(-1).float()
    table[slots // topk, experts] = flat[slots]
    got, _ = comm.all_to_all_matmul(routing, table, _identity_experts(routing, E), **opts)
    return got.gather(1, _received_experts(routing)[:, None]).squeeze(1)


def _grads_to_slots(comm, routing, values, opts):
    """values [R] (one per received row) -> [T, topk] at each slot of the
    token that sent the row."""
    E, topk = routing.num_experts, routing.topk
    table = torch.zeros(values.shape[0], E)
    table[torch.arange(values.shape[0]), _received_experts(routing)] = values.float()
    back = comm.matmul_all_to_all(routing, table, _identity_experts(routing, E), **opts)
    experts, slots = _slot_experts(routing)
    out = torch.zeros(routing.num_tokens * topk)
    out[slots] = back[slots // topk, experts]
    return out.reshape(routing.num_tokens, topk)


class MoeDispatchMatmul(Function):
    """(y [R, n], dispatched x [R, k] if dispatch_output else None):
    every routed slot's token times its expert's weight, expert-grouped."""

    @staticmethod
    def forward(ctx, comm, opts, routing, x, w, dispatch_output):
        need_dw = ctx.needs_input_grad[4]
        y, d = comm.all_to_all_matmul(routing, x, w, dispatch_output=bool(dispatch_output or
                                                                          need_dw), **opts)
        ctx.comm, ctx.opts, ctx.routing = comm, opts, routing
        ctx.out_shape = y.shape
        ctx.save_for_backward(w, d if need_dw else None)
        ctx.set_materialize_grads(False)
        return y.to(x.dtype), (d if dispatch_output else None)

    @staticmethod
    def backward(ctx, dy, dd):
        w, d = ctx.saved_tensors
        routing = ctx.routing
        dy = torch.zeros(ctx.out_shape, dtype=w.dtype) if dy is None else dy.contiguous()
        need_dx, need_dw = ctx.needs_input_grad[3], ctx.needs_input_grad[4]
        wgrad = _overlap_if(need_dw, lambda: _expert_wgrad(routing, d, dy, w.dtype))
        dx = None
        if need_dx:
            lhs, rhs = dy, w.transpose(1, 2).contiguous()
            if dd is not None:
                k = w.shape[1]
                lhs = torch.cat([dy.float(), dd.float()], dim=1)
                rhs = torch.cat([rhs.float(), _identity_experts(routing, k)], dim=1)
            dx = ctx.comm.matmul_all_to_all(routing, lhs, rhs, overlap=wgrad,
                                            **ctx.opts).to(w.dtype)
        dw = wgrad.get() if need_dw else None
        return None, None, None, dx, dw, None


class MoeMatmulCombine(Function):
    """out [T, n]: every received row times its expert's weight, sent home
    and summed per token (weighted by probs [T, topk] if given)."""

    @staticmethod
    def forward(ctx, comm, opts, routing, h, w, probs):
        out = comm.matmul_all_to_all(routing, h, w,
                                     probs=None if probs is None else probs.float().contiguous(),
                                     **opts)
        ctx.comm, ctx.opts, ctx.routing = comm, opts, routing
        ctx.save_for_backward(h, w, probs)
        return out.to(h.dtype)

    @staticmethod
    def backward(ctx, dc):
        h, w, probs = ctx.saved_tensors
        routing, opts = ctx.routing, ctx.opts
        need_dh, need_dw = ctx.needs_input_grad[3], ctx.needs_input_grad[4]
        need_dp = probs is not None and ctx.needs_input_grad[5]
        dc = dc.contiguous()
        # Each received row's gradient before its gate weight: dc[t] w^T.
        dh_u, dc_rows = ctx.comm.all_to_all_matmul(routing, dc, w.transpose(1, 2).contiguous(),
                                                   dispatch_output=need_dw, **opts)
        p = None if probs is None else _probs_at_experts(ctx.comm, routing, probs, opts)
        dh = dh_u if p is None else dh_u * p[:, None]
        dh = dh.to(h.dtype) if need_dh else None
        dw = None
        if need_dw:
            rows = dc_rows.float() if p is None else dc_rows.float() * p[:, None]
            dw = _expert_wgrad(routing, h, rows, w.dtype)
        dp = None
        if need_dp:
            dp = _grads_to_slots(ctx.comm, routing, (dh_u * h.float()).sum(1), opts)
            dp = dp.to(probs.dtype)
        return None, None, None, dh, dw, dp


def _activation_vjp(act, y1, dhidden):
    """dy1 = act's vector-Jacobian product at y1 (act recomputed under autograd)."""
    if act is None:
        return dhidden.float()
    with torch.enable_grad():
        x = y1.detach().float().requires_grad_()
        out = act(x)
        (dy1,) = torch.autograd.grad(out, x, dhidden.to(out.dtype))
    return dy1


class MoeMlp(Function):
    """out [T, d]: dispatch, each expert's w1, act, w2, combine (weighted by
    probs), in one fused call; backward runs the duals of the combine and
    the dispatch with act's gradient between them."""

    @staticmethod
    def forward(ctx, comm, opts, routing, act, x, w1, w2, probs):
        out, dx_rows, y1, hidden = comm.moe_mlp(
            routing, x, w1, w2, activation=act, save=True,
            probs=None if probs is None else probs.float().contiguous(), **opts)
        ctx.comm, ctx.opts, ctx.routing, ctx.act = comm, opts, routing, act
        ctx.save_for_backward(w1, w2, probs, dx_rows, y1, hidden)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, dc):
        w1, w2, probs, dx_rows, y1, hidden = ctx.saved_tensors
        comm, routing, opts = ctx.comm, ctx.routing, ctx.opts
        g = ctx.needs_input_grad
        need_dp = probs is not None and g[7]
        dc = dc.contiguous()
        dhid_u, dc_rows = comm.all_to_all_matmul(routing, dc, w2.transpose(1, 2).contiguous(),
                                                 dispatch_output=g[6], **opts)
        p = None if probs is None else _probs_at_experts(comm, routing, probs, opts)
        dhidden = dhid_u if p is None else dhid_u * p[:, None]
        dw2 = None
        if g[6]:
            rows = dc_rows.float() if p is None else dc_rows.float() * p[:, None]
            dw2 = _expert_wgrad(routing, hidden, rows, w2.dtype)
        dy1 = _activation_vjp(ctx.act, y1, dhidden)
        wgrad = _overlap_if(g[5], lambda: _expert_wgrad(routing, dx_rows, dy1, w1.dtype))
        dx = None
        if g[4]:
            dx = comm.matmul_all_to_all(routing, dy1.to(w1.dtype).contiguous(),
                                        w1.transpose(1, 2).contiguous(), overlap=wgrad,
                                        **opts).to(w1.dtype)
        dw1 = wgrad.get() if g[5] else None
        dp = None
        if need_dp:
            dp = _grads_to_slots(comm, routing, (dhid_u * hidden.float()).sum(1), opts)
            dp = dp.to(probs.dtype)
        return None, None, None, None, dx, dw1, dw2, dp
