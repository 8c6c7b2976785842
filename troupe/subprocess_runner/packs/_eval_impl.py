"""The eval pack's code (imported when an eval node executes)."""

from __future__ import annotations

import re
from typing import Any

_CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "didnt": "didn't", "doesnt": "doesn't", "dont": "don't", "hadnt": "hadn't", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hes": "he's", "howd": "how'd", "howll": "how'll", "hows": "how's",
    "Im": "I'm", "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itll": "it'll", "lets": "let's",
    "shouldnt": "shouldn't", "thats": "that's", "theres": "there's", "theyre": "they're", "theyve": "they've",
    "wasnt": "wasn't", "werent": "weren't", "whats": "what's", "wheres": "where's", "whos": "who's",
    "wont": "won't", "wouldnt": "wouldn't", "youre": "you're", "youve": "you've",
}
_NUMBERS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
            "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_ARTICLES = {"a", "an", "the"}
_PUNCTUATION = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",",
                "?", "!"]
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_NUMBER = re.compile(r"(\d)(,)(\d)")


def normalize_answer(text: str) -> str:
    """The VQA evaluation's normalisation: punctuation, periods, number words,
    articles and contractions, in that order."""
    text = text.replace("\n", " ").replace("\t", " ").strip().lower()
    for mark in _PUNCTUATION:
        if (f"{mark} " in text or f" {mark}" in text) or _COMMA_NUMBER.search(text) is not None:
            text = text.replace(mark, "")
        else:
            text = text.replace(mark, " ")
    text = _PERIOD.sub("", text)
    words = []
    for word in text.split():
        word = _NUMBERS.get(word, word)
        if word in _ARTICLES:
            continue
        words.append(_CONTRACTIONS.get(word, word))
    return " ".join(words)


def _split(text: str, separator: str) -> list[str]:
    return [part.strip() for part in text.split(separator or "\n") if part.strip()]


def _pairs(inputs: dict[str, Any]) -> tuple[list[str], list[str]]:
    hypotheses, references = list(inputs["hypotheses"]), list(inputs["references"])
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("there is nothing to score")
    return hypotheses, references


def texts(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"texts": _split(params["text"], params["separator"])}


def answers(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"answers": [_split(line, params["answer_separator"]) for line in _split(params["text"],
                                                                                   params["separator"])]}


def bleu(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    import sacrebleu

    hypotheses, references = _pairs(inputs)
    score = float(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    ctx.metric(params["metric"], score)
    return {"score": score}


def rouge(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    from rouge_score import rouge_scorer

    hypotheses, references = _pairs(inputs)
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    scores = [scorer.score(ref, hyp)["rougeL"].fmeasure for hyp, ref in zip(hypotheses, references, strict=True)]
    score = sum(scores) / len(scores)
    ctx.metric(params["metric"], score)
    return {"score": score}


def vqa_accuracy(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    predictions, answer_sets = list(inputs["predictions"]), list(inputs["answers"])
    if len(predictions) != len(answer_sets):
        raise ValueError(f"{len(predictions)} predictions but {len(answer_sets)} answer sets")
    if not predictions:
        raise ValueError("there is nothing to score")
    total = 0.0
    for prediction, given in zip(predictions, answer_sets, strict=True):
        guess = normalize_answer(str(prediction))
        matches = sum(1 for answer in given if normalize_answer(str(answer)) == guess)
        total += min(matches / 3, 1.0)
    score = total / len(predictions)
    ctx.metric(params["metric"], score)
    return {"score": score}


def batch_inference(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from troupe.subprocess_runner.packs._torch_runtime import model_device, prepare

    prepare(ctx)
    model, data = inputs["model"], inputs["data"]
    settings = dict(getattr(model, "generation_config", None) or {})
    if params["max_new_tokens"] > 0:
        settings["max_new_tokens"] = params["max_new_tokens"]
    if params["temperature"] >= 0:
        settings["temperature"] = params["temperature"]
    loader = data.loader
    if params["batch_size"]:
        loader = DataLoader(TensorDataset(data.data.x, data.data.y), batch_size=params["batch_size"], shuffle=False)
    if settings:
        ctx.log(f"generation settings: {settings}")
    generate = getattr(model, "generate", None)
    model.eval()
    results: list[Any] = []
    with torch.no_grad():
        for x, _ in loader:
            ctx.check_cancelled()
            if callable(generate):
                results.extend(generate(x, **settings))
            else:
                out = model(x.to(model_device(model))).cpu()
                results.append(out.argmax(dim=1) if data.data.task == "classification" else out)
    if results and all(isinstance(r, torch.Tensor) for r in results) and not callable(generate):
        return {"predictions": torch.cat(results)}
    return {"predictions": results}
