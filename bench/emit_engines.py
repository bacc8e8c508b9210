#!/usr/bin/python3
"""Feeds what `loom plan --emit` wrote to the engines' own argument and configuration checks.

    emit_engines.py megatron|deepspeed|fsdp LIST

LIST holds one emitted script a line: `name<TAB>gpu-arch<TAB>path` (gpu-arch: the CUDA compute
capability's major number of the plan's cluster, 8 for A100, 9 for H100). Prints one line per
script, `name engine: accepted` or `name engine: rejected: <the engine's message>`, and exits 1
when any is rejected.

- megatron: the torchrun line goes through torch.distributed.run's own parser; the training
  script's arguments through Megatron-LM's parse_args and validate_args
  (megatron/training/arguments.py), with the environment the line sets and the WORLD_SIZE torchrun
  would give; a --pipeline-model-parallel-layout also through Megatron-LM's
  PipelineParallelLayerLayout.validate_layer_layout; then the TransformerConfig that
  core_transformer_config_from_args (megatron/training/argument_utils.py) builds from them.
- deepspeed: ds_config.json goes to DeepSpeed's DeepSpeedConfig, whose data-parallel size is the
  one the script's comments set up (a PipeModelDataParallelTopology they name, PipelineModule's
  own topology, or Megatron's mpu for tp); the launch line through the DeepSpeed launcher's
  parse_args (deepspeed/launcher/runner.py), its hostfile through the launcher's hostfile parser.
- fsdp: the torchrun line as for megatron.

A multi-node torchrun line must carry a rendezvous endpoint or a node rank and a master address;
a multi-node deepspeed line a hostfile and --master_addr.

Paths: MEGATRON and DEEPSPEED (environment) name the engines' source checkouts. The engines run
on this machine's CPU-only PyTorch; what they import that is absent here (a GPU, packages the
argument checks never call) is stubbed below, and nothing of the checks themselves is.
"""

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import re
import shlex
import sys
import types

# What a user sets on each node before running a multi-node line (the values of node 0).
NODE_ENV = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "0", "JOB_ID": "loom"}

# Arguments an emitted Megatron-LM line leaves to the user (its comment says so): mock data, a
# tokenizer, the schedule's length and the learning rate.
MEGATRON_USER_ARGS = [
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "50257",
    "--train-iters", "10", "--lr", "1e-4",
]

# ---------------------------------------------------------------------------------------------
# The shim: modules and attributes the engines import at load time that this machine lacks.
# Debian's PyTorch 1.13 (on Python 3.11, no CUDA) predates names that Megatron-LM and DeepSpeed
# import; none of them is called by an argument or configuration check.


class _Anything(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder


class Placeholder(metaclass=_Anything):
    """Stands for a class or function of an absent package; calling it gives another."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return Placeholder()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder()


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path, target=None):
        if any(name == n or name.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _PlaceholderModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        module.__version__ = STUB_VERSIONS.get(module.__name__, "0.0.0")


def _identity_decorator(fn=None, *args, **kwargs):
    return fn if callable(fn) else (lambda f: f)


def install_shim(modules, attributes):
    sys.meta_path.insert(0, _StubFinder(modules))
    for module_name, names in attributes.items():
        module = importlib.import_module(module_name)
        for name in names:
            if not hasattr(module, name):
                value = _identity_decorator if name in ("compile", "override") else Placeholder
                setattr(module, name, value)


# PyTorch 1.13 lacks torch.distributed.checkpoint/tensor/device_mesh, FSDP2, symmetric memory and
# the float8 dtypes; its torch.distributed._shard fails to import on Python 3.11 (a dataclass
# default); Triton is not packaged. Megatron-LM imports all of them when it loads.
# TransformerEngine (a CUDA build) stands in at a release Megatron-LM's version checks accept, as
# on a GPU machine: TransformerConfig refuses its TE-only defaults (rope fusion) without it.
MEGATRON_SHIM_MODULES = [
    "torch.distributed.checkpoint", "torch.distributed._shard", "torch.distributed._tensor",
    "torch.distributed.tensor", "torch.distributed.fsdp", "torch.distributed._composable",
    "torch.distributed.device_mesh", "torch.distributed._symmetric_memory", "triton",
    "numpy.dtypes", "transformer_engine",
]
STUB_VERSIONS = {"transformer_engine": "2.9.0"}
MEGATRON_SHIM_ATTRIBUTES = {
    "torch": ["float8_e8m0fnu", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
              "float8_e5m2fnuz", "uint16", "uint32", "uint64", "compile"],
    "torch.distributed": ["DeviceMesh", "init_device_mesh", "_coalescing_manager"],
    "torch.cuda.memory": ["CUDAPluggableAllocator"],
    "torch.optim.optimizer": ["ParamsT"],
    "torch.cuda": ["MemPool"],
    "typing": ["override"],
}
# DeepSpeed: hjson reads configuration files (this check passes a parsed dict) and einops serves
# the FLOPs profiler; neither is packaged here.
DEEPSPEED_SHIM_MODULES = ["hjson", "einops"]


# ---------------------------------------------------------------------------------------------
# Reading an emitted script.


class Rejected(Exception):
    """An engine's (or the launch rules') refusal, with its message."""


class Script:
    """An emitted shell script: its comments, here-documents, exports and commands."""

    def __init__(self, text):
        self.comments = []
        self.files = {}
        self.exports = {}
        self.commands = []  # (environment assignments, argv)
        lines = text.splitlines()
        i = 0
        pending = ""
        while i < len(lines):
            line = lines[i]
            i += 1
            if not pending and line.lstrip().startswith("#"):
                self.comments.append(line.lstrip()[1:].strip())
                continue
            heredoc = re.match(r"\s*cat\s*>\s*(\S+)\s*<<\s*'?(\w+)'?\s*$", line)
            if not pending and heredoc:
                body = []
                while i < len(lines) and lines[i] != heredoc.group(2):
                    body.append(lines[i])
                    i += 1
                i += 1
                self.files[heredoc.group(1)] = "\n".join(body) + "\n"
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            command = (pending + line).strip()
            pending = ""
            if command:
                self._command(command)

    def _command(self, command):
        words = [os.path.expandvars(w) for w in shlex.split(command)]
        if words[0] == "export":
            for w in words[1:]:
                key, _, value = w.partition("=")
                self.exports[key] = value
            return
        env = {}
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        self.commands.append((env, words))

    def command(self, program):
        for env, argv in self.commands:
            if argv and argv[0] == program:
                return {**self.exports, **env}, argv
        raise Rejected(f"no {program} line in the script")


def check_torchrun(argv):
    """torch.distributed.run's own parser; returns (parsed args, world size)."""
    from torch.distributed.run import get_args_parser

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = get_args_parser().parse_args(argv[1:])
    except SystemExit:
        raise Rejected("torchrun: " + stderr.getvalue().strip().splitlines()[-1])
    nodes = int(str(args.nnodes).split(":")[-1])
    world = nodes * int(args.nproc_per_node)
    if nodes > 1:
        rendezvous = args.rdzv_backend not in (None, "", "static") and args.rdzv_endpoint
        given = {w.split("=")[0].replace("-", "_") for w in argv if w.startswith("--")}
        ranked = "--node_rank" in given and "--master_addr" in given
        if args.standalone or not (rendezvous or ranked):
            raise Rejected(f"torchrun: {nodes} nodes but neither a rendezvous endpoint "
                           "(--rdzv_backend c10d --rdzv_endpoint) nor --node_rank with "
                           "--master_addr: the nodes never meet")
    return args, world


def torchrun_fallback(argv):
    """The training script, its arguments and the world size of a line torchrun refused."""
    at = next(i for i, w in enumerate(argv) if w.endswith(".py"))
    options = argv[1:at]

    def value(*names):
        for i, w in enumerate(options):
            if w in names and i + 1 < len(options):
                return options[i + 1]
        return "1"

    world = int(value("--nnodes").split(":")[-1]) * int(
        value("--nproc_per_node", "--nproc-per-node"))
    return types.SimpleNamespace(training_script=argv[at],
                                 training_script_args=argv[at + 1:]), world


# ---------------------------------------------------------------------------------------------
# Megatron-LM.


def load_megatron(root):
    install_shim(MEGATRON_SHIM_MODULES, MEGATRON_SHIM_ATTRIBUTES)
    sys.path.insert(0, root)
    import torch

    import megatron.training.arguments as arguments
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )
    from megatron.training.argument_utils import core_transformer_config_from_args

    return torch, arguments, PipelineParallelLayerLayout, core_transformer_config_from_args


def check_megatron(engine, script, arch, problems):
    torch, arguments, Layout, core_transformer_config_from_args = engine
    env, argv = script.command("torchrun")
    try:
        run_args, world = check_torchrun(argv)
    except Rejected as e:
        # Megatron-LM's check still runs on what the line hands the training script.
        problems.append(str(e))
        run_args, world = torchrun_fallback(argv)
    # The one device query validate_args makes (megatron/training/utils: get_device_arch_version)
    # answered with the plan's GPU generation.
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=arch, minor=0)
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.update(env)
    os.environ.update({"WORLD_SIZE": str(world), "RANK": "0"})
    sys.argv = [run_args.training_script] + run_args.training_script_args + MEGATRON_USER_ARGS
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = arguments.parse_args()
            arguments.validate_args(args)
            if args.pipeline_model_parallel_layout is not None:
                layout = args.pipeline_model_parallel_layout
                if isinstance(layout, str):
                    layout = Layout(layout, args.pipeline_model_parallel_size)
                layout.validate_layer_layout(args.num_layers, args.mtp_num_layers)
            # The model's TransformerConfig, as pretrain_gpt.py builds it: its __post_init__
            # checks the layout, recomputation, fp8 and parallel settings once more.
            core_transformer_config_from_args(args)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        raise Rejected("parse_args: " + (lines[-1] if lines else "exit"))
    except (AssertionError, ValueError, RuntimeError, NotImplementedError) as e:
        raise Rejected(f"{type(e).__name__}: {e}")
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv


# ---------------------------------------------------------------------------------------------
# DeepSpeed.


def load_deepspeed(root):
    install_shim(DEEPSPEED_SHIM_MODULES, {})
    sys.path.insert(0, root)
    import deepspeed.launcher.runner as runner
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.pipe.topology import (
        PipeDataParallelTopology,
        PipeModelDataParallelTopology,
    )

    # DeepSpeedConfig asks the mpu for the data-parallel size only once deepspeed.comm answers
    # get_rank(): a one-process gloo group on the loopback address. DeepSpeed's shared-memory
    # collective op needs a C++ build (the ninja Python package) this machine lacks: it is
    # marked unbuildable in DeepSpeed's own table, as an install without it would be.
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    import torch.distributed

    # PyTorch 1.13's init_process_group predates an argument DeepSpeed passes; with the group
    # already up, DeepSpeed's backend adopts it.
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0,
                                         world_size=1)

    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"})
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    return runner, DeepSpeedConfig, PipeDataParallelTopology, PipeModelDataParallelTopology


class _Mpu:
    """What DeepSpeedConfig asks an mpu: the data-parallel world size."""

    def __init__(self, dp):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp


def data_parallel_size(engine, script, world):
    """The data-parallel size the script's comments set the engine up with."""
    _, _, PipeDataParallelTopology, PipeModelDataParallelTopology = engine
    text = "\n".join(script.comments)
    named = re.search(r"PipeModelDataParallelTopology\(num_pp=(\d+), num_mp=(\d+), num_dp=(\d+)\)",
                      text)
    if named:
        pp, mp, dp = (int(g) for g in named.groups())
        if pp * mp * dp != world:
            raise Rejected(f"topology pp {pp} x mp {mp} x dp {dp} != world {world}")
        return PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp).get_dim("data")
    stages = re.search(r"PipelineModule\(num_stages=(\d+)\)", text)
    if stages:
        # deepspeed/runtime/pipe/module.py: without a topology, PipelineModule builds
        # PipeDataParallelTopology(num_pp=num_stages, num_dp=world // num_stages).
        pp = int(stages.group(1))
        return PipeDataParallelTopology(num_pp=pp, num_dp=world // pp).get_dim("data")
    tp = re.search(r"tp=(\d+): tensor parallelism is the model's", text)
    return world // int(tp.group(1)) if tp else world


def check_deepspeed_nodes(runner, script, args):
    if args.num_nodes <= 1:
        return
    if not args.master_addr:
        raise Rejected("deepspeed launcher: multi-node without --master_addr")
    if args.hostfile not in script.files:
        raise Rejected(f"deepspeed launcher: multi-node without a hostfile ({args.hostfile})")
    pool = runner._parse_hostfile(script.files[args.hostfile].splitlines())
    if len(pool) < args.num_nodes or any(s < args.num_gpus for s in pool.values()):
        raise Rejected(f"deepspeed launcher: hostfile {dict(pool)} lacks {args.num_nodes} "
                       f"nodes of {args.num_gpus} slots")


def check_deepspeed(engine, script, arch, problems):
    runner, DeepSpeedConfig, _, _ = engine
    _, argv = script.command("deepspeed")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = runner.parse_args(argv[1:])
    except SystemExit:
        raise Rejected("deepspeed launcher: " + err.getvalue().strip().splitlines()[-1])
    world = args.num_nodes * args.num_gpus
    try:
        check_deepspeed_nodes(runner, script, args)
    except Rejected as e:
        problems.append(str(e))  # the configuration is still checked
    config_path = argv[argv.index("--deepspeed_config") + 1]

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise Rejected(f"duplicate keys in {config_path}")
        return dict(pairs)

    config = json.loads(script.files[config_path], object_pairs_hook=no_duplicates)
    dp = data_parallel_size(engine, script, world)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            DeepSpeedConfig(config, mpu=_Mpu(dp))
    except Exception as e:  # DeepSpeed raises assertions, pydantic errors and its own types
        raise Rejected(f"DeepSpeedConfig (dp {dp}): {type(e).__name__}: {e}".replace("\n", " "))


def check_fsdp(engine, script, arch, problems):
    _, argv = script.command("torchrun")
    check_torchrun(argv)


def main():
    engine_name, listing = sys.argv[1], sys.argv[2]
    saved = dict(os.environ)
    if engine_name == "megatron":
        engine, check = load_megatron(os.environ["MEGATRON"]), check_megatron
    elif engine_name == "deepspeed":
        engine, check = load_deepspeed(os.environ["DEEPSPEED"]), check_deepspeed
    else:
        engine, check = None, check_fsdp
    os.environ.clear()
    os.environ.update({**saved, **NODE_ENV})
    rejected = 0
    with open(listing) as f:
        entries = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    for name, arch, path in entries:
        with open(path) as f:
            text = f.read()
        problems = []
        try:
            check(engine, Script(text), int(arch), problems)
        except Rejected as e:
            problems.append(str(e))
        if problems:
            rejected += 1
            print(f"{name} {engine_name}: rejected: {'; '.join(problems)}", flush=True)
        else:
            print(f"{name} {engine_name}: accepted", flush=True)
    return 1 if rejected else 0


if __name__ == "__main__":
    sys.exit(main())
