"""The eval nodes on small fixed texts with known scores, through the engine."""

from __future__ import annotations

import pytest

from tests.helpers import edge, graph, node
from troupe.protocol.graph import Graph
from troupe.subprocess_runner.catalog import load_catalog
from troupe.subprocess_runner.context import ExecutionContext, Sinks
from troupe.subprocess_runner.engine import execute_graph, prepare_executable_graph
from troupe.subprocess_runner.packs._eval_impl import normalize_answer

HYPOTHESES = "the cat sat on the mat\na quick brown fox jumps"
REFERENCES = "the cat sat on a mat\nthe quick brown fox jumped"


def score(kind, first, second, left="hypotheses", right="references", second_type="eval.Texts"):
    doc = graph(
        node("h", "eval.Texts", text=first), node("r", second_type, text=second), node("s", kind),
        edges=(edge("h", "texts", "s", left), edge("r", "texts" if second_type == "eval.Texts" else "answers",
                                                     "s", right)),
    )
    metrics = []
    ctx = ExecutionContext("e" * 32, None, "cpu", None,
                           Sinks(lambda k, n, p: metrics.append(p) if k == "metric" else None))
    outcome = execute_graph(prepare_executable_graph(Graph.model_validate(doc), load_catalog()), ctx)
    assert outcome.status == "succeeded", outcome.error
    return outcome.outputs["s"]["score"], metrics


def test_bleu_of_two_sentences():
    value, metrics = score("eval.BLEU", HYPOTHESES, REFERENCES)
    assert value == pytest.approx(43.13894, abs=1e-4)
    assert metrics == [{"name": "bleu", "step": 1, "value": value}]
    assert score("eval.BLEU", REFERENCES, REFERENCES)[0] == pytest.approx(100.0)


def test_rouge_l_is_the_mean_lcs_f_measure():
    value, metrics = score("eval.ROUGE", HYPOTHESES, REFERENCES)
    # LCS 5 of 6 words, then 3 of 5 ("quick brown fox").
    assert value == pytest.approx((5 / 6 + 3 / 5) / 2)
    assert metrics[0]["name"] == "rouge_l"


def test_vqa_accuracy_normalises_and_caps_at_three_matches():
    predictions = "Two\nyes\nA dog.\nred"
    answers = "2|2|two|2|3\nno|no|yes\ndog|the dog|dog|a dog\nblue"
    value, metrics = score("eval.VQAAccuracy", predictions, answers, "predictions", "answers", "eval.Answers")
    # 4 matches -> 1; 1 match -> 1/3; 4 matches -> 1; none -> 0.
    assert value == pytest.approx((1 + 1 / 3 + 1 + 0) / 4)
    assert metrics[0]["name"] == "vqa_accuracy"


@pytest.mark.parametrize("raw, normal", [("Two", "2"), ("the Dog.", "dog"), ("dont", "don't"),
                                         ("yes!", "yes"), ("3.5", "3.5"), ("10,000", "10000")])
def test_vqa_normalisation(raw, normal):
    assert normalize_answer(raw) == normal


def test_mismatched_lengths_fail_the_node():
    doc = graph(node("h", "eval.Texts", text="a\nb"), node("r", "eval.Texts", text="a"), node("s", "eval.BLEU"),
                edges=(edge("h", "texts", "s", "hypotheses"), edge("r", "texts", "s", "references")))
    ctx = ExecutionContext("e" * 32, None, "cpu", None, Sinks(lambda *a: None))
    outcome = execute_graph(prepare_executable_graph(Graph.model_validate(doc), load_catalog()), ctx)
    assert outcome.status == "failed" and "2 hypotheses but 1 references" in outcome.error


def test_batch_inference_takes_generation_settings_from_the_model_and_overrides():
    from troupe.subprocess_runner.catalog import NodeType, Pack, Port, build_catalog
    from troupe.subprocess_runner.packs import core, eval_pack, torch_pack

    seen = []

    class Generator:
        def __init__(self):
            self.generation_config = {"max_new_tokens": 5, "temperature": 0.7}

        def eval(self):
            return self

        def generate(self, x, **settings):
            seen.append(settings)
            return [f"row{i}" for i in range(len(x))]

    def make(ctx, inputs, params):
        return {"model": Generator()}

    catalog = build_catalog([core.PACK, torch_pack.PACK, eval_pack.PACK,
                             Pack("t", (NodeType("t.Generator", make, outputs=(Port("model", "model"),)),))])
    doc = graph(
        node("d", "torch.SyntheticClassification", n=10, features=3, val_fraction=0.0),
        node("l", "torch.DataLoader", batch_size=4, shuffle=False), node("g", "t.Generator"),
        node("b", "eval.BatchInference", temperature=0.0),
        edges=(edge("d", "train", "l", "dataset"), edge("g", "model", "b", "model"), edge("l", "loader", "b", "data")),
    )
    ctx = ExecutionContext("e" * 32, None, "cpu", None, Sinks(lambda *a: None))
    outcome = execute_graph(prepare_executable_graph(Graph.model_validate(doc), catalog), ctx)
    assert outcome.status == "succeeded", outcome.error
    assert outcome.outputs["b"]["predictions"] == [f"row{i}" for i in (0, 1, 2, 3, 0, 1, 2, 3, 0, 1)]
    assert seen == [{"max_new_tokens": 5, "temperature": 0.0}] * 3
