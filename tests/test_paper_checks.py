"""The paper's own checks (§2-4), and a reference written straight from eq. 1-6 in the D x N notation."""

import pytest
import torch

from turner_tfm import TurnerForCausalLM, TurnerModel
from turner_tfm.modeling_turner import TurnerAttention, TurnerBlock

from .tiny import random_ids, text_config


def reference_mhsa(attention: TurnerAttention, X: torch.Tensor, causal: bool) -> torch.Tensor:
    """Eq. 4-6 with X of size D x N: Y = sum_h V_h X A_h, [A_h]_{n,n'} = softmax_n(k_{h,n}^T q_{h,n'} / sqrt(K))."""
    D, N = X.shape
    H, K = attention.config.num_attention_heads, attention.head_dim
    U_q, U_k, U_v = attention.qkv_proj.weight.chunk(3)  # stacked U_q,h, then U_k,h, then U_v,h
    b_q, b_k, b_v = attention.qkv_proj.bias.chunk(3)
    U_o, b_o = attention.o_proj.weight, attention.o_proj.bias
    Y = torch.zeros(D, N, dtype=X.dtype)
    for h in range(H):
        rows = slice(h * K, (h + 1) * K)
        Q = U_q[rows] @ X + b_q[rows, None]  # K x N, eq. 6
        Kh = U_k[rows] @ X + b_k[rows, None]
        scores = Kh.T @ Q / K**0.5  # [n, n'] = k_n^T q_n'
        if causal:  # §4.1: A_{n,n'} = 0 when n > n'
            scores = scores.masked_fill(torch.ones(N, N, dtype=torch.bool).tril(-1), float("-inf"))
        A = torch.softmax(scores, dim=0)  # each column sums to 1 (eq. 1)
        V_h = U_o[:, rows] @ U_v[rows]  # D x D, footnote 13
        Y = Y + V_h @ X @ A + U_o[:, rows] @ b_v[rows, None] @ A.sum(0, keepdim=True)
    return Y + b_o[:, None]


def reference_block(block: TurnerBlock, X: torch.Tensor, causal: bool) -> torch.Tensor:
    """§2.3 with the norm on the inputs of each stage: x + MHSA(LN(x)), then x + MLP(LN(x)), in D x N."""

    def token_norm(norm, X):
        mean, var = X.mean(0, keepdim=True), X.var(0, unbiased=False, keepdim=True)
        return (X - mean) / torch.sqrt(var + norm.eps) * norm.weight[:, None] + norm.bias[:, None]

    X = X + reference_mhsa(block.self_attn, token_norm(block.attn_norm, X), causal)
    mlp = block.mlp
    hidden = mlp.act_fn(mlp.up_proj.weight @ token_norm(block.mlp_norm, X) + mlp.up_proj.bias[:, None])
    return X + mlp.down_proj.weight @ hidden + mlp.down_proj.bias[:, None]


@pytest.mark.parametrize("causal", [True, False])
def test_reference_from_equations_reproduces_the_block(causal):
    model = TurnerModel(text_config(is_causal=causal, position_embedding_type="none")).eval()
    tokens = torch.randn(1, 7, 32)
    with torch.no_grad():
        output = model(inputs_embeds=tokens).last_hidden_state[0]
        X = tokens[0].T  # D x N
        for block in model.layers:
            X = reference_block(block, X, causal)
        norm = model.norm
        expected = torch.nn.functional.layer_norm(X.T, (32,), norm.weight, norm.bias, norm.eps)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)


def test_output_has_the_input_shape():
    model = TurnerModel(text_config()).eval()
    tokens = torch.randn(2, 11, 32)
    assert model(inputs_embeds=tokens).last_hidden_state.shape == tokens.shape


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_without_positions_or_mask_the_model_is_permutation_equivariant(implementation):
    config = text_config(is_causal=False, position_embedding_type="none", attn_implementation=implementation)
    model = TurnerModel(config).eval()
    ids = random_ids(2, 10)
    permutation = torch.randperm(10)
    with torch.no_grad():
        output = model(ids).last_hidden_state
        permuted_output = model(ids[:, permutation]).last_hidden_state
    torch.testing.assert_close(permuted_output, output[:, permutation], atol=1e-5, rtol=1e-5)


def test_positions_break_permutation_equivariance():
    model = TurnerModel(text_config(is_causal=False)).eval()
    ids = random_ids(1, 10)
    permutation = torch.arange(9, -1, -1)
    with torch.no_grad():
        output = model(ids).last_hidden_state
        permuted_output = model(ids[:, permutation]).last_hidden_state
    assert not torch.allclose(permuted_output, output[:, permutation], atol=1e-3)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_appending_a_token_leaves_earlier_outputs_unchanged(implementation):
    model = TurnerModel(text_config(attn_implementation=implementation)).eval()
    ids = random_ids(2, 12)
    with torch.no_grad():
        longer = model(ids).last_hidden_state
        shorter = model(ids[:, :-1]).last_hidden_state
    torch.testing.assert_close(longer[:, :-1], shorter, atol=1e-5, rtol=1e-5)


def test_bidirectional_model_lacks_the_incremental_property():
    model = TurnerModel(text_config(is_causal=False)).eval()
    ids = random_ids(1, 12)
    with torch.no_grad():
        longer = model(ids).last_hidden_state
        shorter = model(ids[:, :-1]).last_hidden_state
    assert not torch.allclose(longer[:, :-1], shorter, atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_columns_sum_to_one_and_the_future_gets_zero_weight(causal):
    config = text_config(is_causal=causal, attn_implementation="eager")
    model = TurnerForCausalLM(config).eval()
    with torch.no_grad():
        attentions = model(random_ids(2, 9), output_attentions=True).attentions
    assert len(attentions) == config.num_hidden_layers
    for weights in attentions:  # (batch, heads, query n', key n): the paper's A_{n, n'} transposed
        assert weights.shape == (2, config.num_attention_heads, 9, 9)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 9))
        above_diagonal = weights.masked_select(torch.ones(9, 9, dtype=torch.bool).triu(1))
        if causal:
            assert torch.count_nonzero(above_diagonal) == 0
        else:
            assert bool((above_diagonal > 0).all())
