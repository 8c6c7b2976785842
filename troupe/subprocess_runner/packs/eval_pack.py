"""The eval pack: scores that a sweep or study can rank runs by (BLEU, ROUGE-L, VQA
accuracy) and batch inference. Declarations only; the code, and sacrebleu and
rouge-score with it, is imported when a node executes."""

from __future__ import annotations

from troupe.subprocess_runner.node_types import NodeType, Pack, Param, Port, lazy

_IMPL = "troupe.subprocess_runner.packs._eval_impl"

PACK = Pack(
    name="eval",
    node_types=(
        NodeType(
            "eval.Texts", lazy(f"{_IMPL}:texts"), outputs=(Port("texts", "texts"),),
            params=(Param("text", "string"), Param("separator", "string", default="\n")),
            description="A list of texts, one per line (or per separator).",
        ),
        NodeType(
            "eval.Answers", lazy(f"{_IMPL}:answers"), outputs=(Port("answers", "answers"),),
            params=(Param("text", "string"), Param("separator", "string", default="\n"),
                    Param("answer_separator", "string", default="|")),
            description="Reference answers per question: one line each, answers split by '|'.",
        ),
        NodeType(
            "eval.BLEU", lazy(f"{_IMPL}:bleu"),
            inputs=(Port("hypotheses", "texts"), Port("references", "texts")), outputs=(Port("score", "float"),),
            params=(Param("metric", "string", default="bleu", description="the series to log the score in"),),
            description="Corpus BLEU (sacrebleu), 0 to 100.",
        ),
        NodeType(
            "eval.ROUGE", lazy(f"{_IMPL}:rouge"),
            inputs=(Port("hypotheses", "texts"), Port("references", "texts")), outputs=(Port("score", "float"),),
            params=(Param("metric", "string", default="rouge_l"),),
            description="Mean ROUGE-L F-measure (rouge-score), 0 to 1.",
        ),
        NodeType(
            "eval.VQAAccuracy", lazy(f"{_IMPL}:vqa_accuracy"),
            inputs=(Port("predictions", "texts"), Port("answers", "answers")), outputs=(Port("score", "float"),),
            params=(Param("metric", "string", default="vqa_accuracy"),),
            description="VQA accuracy: answers normalised the standard way, min(matches / 3, 1) per question.",
        ),
        NodeType(
            "eval.BatchInference", lazy(f"{_IMPL}:batch_inference"),
            inputs=(Port("model", "model"), Port("data", "loader")), outputs=(Port("predictions", "any"),),
            params=(
                Param("batch_size", "int", default=0, min=0, description="0: the loader's"),
                Param("max_new_tokens", "int", default=0, min=0, description="0: the model's own setting"),
                Param("temperature", "float", default=-1.0, min=-1.0, max=10.0,
                      description="below 0: the model's own setting"),
            ),
            description="Runs a model over a dataset in batches, with the model's generation settings.",
        ),
    ),
)
