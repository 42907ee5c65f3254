"""Modules that own parameters, built from the pure ops (see module.py for the protocol)."""
from hpcpar.nn.gpt import GPT, GPTConfig
from hpcpar.nn.mlp_model import MLPConfig, MLPModel
from hpcpar.nn.module import Context, Module
from hpcpar.nn.parameter import Parameter, Shard

__all__ = ["GPT", "GPTConfig", "MLPConfig", "MLPModel", "Context", "Module", "Parameter", "Shard"]
