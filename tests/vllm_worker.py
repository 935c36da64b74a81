"""Runs in the vLLM virtual environment (`bash .ci/run --engines` makes it), where `turner_tfm` is not installed:
loads a saved Turner folder with vLLM's Transformers backend (`model_impl="transformers"`, the folder's own code through
`trust_remote_code`) and prints one JSON line of what vLLM computed. `tests/test_vllm.py` starts it as
`python -I tests/vllm_worker.py JOB.json` and compares the line with transformers' `generate()` and forward pass on
the same folder, in its own environment.

JOB.json holds a list of jobs, run one after another in this process (one engine at a time), each
`{"folder": ..., "task": "generate" | "embed", "prompts": [[token ids], ...], "max_tokens": 12,
"tensor_parallel_size": 1, "compile": false, "in_process": false}` (`in_process`: the engine's core runs in this
process, VLLM_ENABLE_V1_MULTIPROCESSING=0, instead of in a process of its own, vLLM's default). For each, one line
`VLLM_RESULT {"folder": ..., "transformers": version, "vllm": version, "turner_tfm_importable": bool, "tokens":
[[ids], ...]}` (`generate`, greedy, past any end token) or `"embeddings": [[floats], ...]` (`embed`, the pooling
runner's default pooling), or `{"folder": ..., "error": traceback}` for a job that failed (the jobs after it still
run: put a job expected to fail last).
"""

import gc
import importlib.util
import json
import os
import sys
import traceback


def run(job: dict) -> dict:
    import transformers
    import vllm
    from vllm import LLM, SamplingParams

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if job.get("in_process") else "1"
    engine = LLM(
        model=job["folder"],
        model_impl="transformers",
        trust_remote_code=True,
        dtype="float32",
        max_model_len=job.get("max_model_len"),
        tensor_parallel_size=job.get("tensor_parallel_size", 1),
        enforce_eager=not job.get("compile", False),
        runner="pooling" if job["task"] == "embed" else "generate",
        seed=0,
    )
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    answer = {
        "folder": job["folder"],
        "transformers": transformers.__version__,
        "vllm": vllm.__version__,
        "turner_tfm_importable": importlib.util.find_spec("turner_tfm") is not None,
    }
    try:
        if job["task"] == "generate":
            sampling = SamplingParams(temperature=0, max_tokens=job["max_tokens"], ignore_eos=True)
            outputs = engine.generate(prompts, sampling, use_tqdm=False)
            answer["tokens"] = [list(output.outputs[0].token_ids) for output in outputs]
        else:
            outputs = engine.embed(prompts, use_tqdm=False)
            answer["embeddings"] = [list(output.outputs.embedding) for output in outputs]
    finally:
        engine.llm_engine.engine_core.shutdown()  # its processes end before the next job's engine starts
        del engine
        gc.collect()
    return answer


if __name__ == "__main__":  # vLLM starts its engine in spawned processes, which import this file again
    with open(sys.argv[1]) as job_file:
        jobs = json.load(job_file)
    for job in jobs:
        try:
            answer = run(job)
        except Exception:
            answer = {"folder": job["folder"], "error": traceback.format_exc()}
        print("VLLM_RESULT " + json.dumps(answer), flush=True)
    # Every answer is out and every engine shut down. At interpreter exit, vLLM 0.32 on the CPU can then abort in C++
    # teardown ("terminate called without an active exception": a running std::thread destroyed; SIGABRT, once in a
    # CI run of the lane, after both answers of the embeddings test). That is teardown, not the answers under test:
    # skip it.
    sys.stderr.flush()
    os._exit(0)
