#!/usr/bin/env python3
"""Exports the ONNX test models in tests/onnx/models/ (committed; the tests
need only numpy and, for the comparison, onnxruntime).

Random-weight models with small configs, each exported twice where the
exporter manages: with the TorchScript exporter (opset 17, `NAME.ts17.onnx`)
and with the dynamo exporter (opset 18, `NAME.dyn18.onnx`).  Needs torch,
torchvision, transformers, onnx and onnxscript:

    pip install torch torchvision transformers onnx onnxscript
    python3 tests/onnx/make_models.py            # all
    python3 tests/onnx/make_models.py mlp bert   # some
"""
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "models")
warnings.filterwarnings("ignore")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x):
        return torch.log_softmax(self.l3(torch.nn.functional.gelu(self.l2(torch.relu(self.l1(x))))), dim=-1)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.b1(self.c1(x))), 2)
        x = torch.nn.functional.avg_pool2d(torch.relu(self.b2(self.c2(x))), 2)
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def randomize_bn(m):
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)


def small_resnet():
    from torchvision.models.resnet import BasicBlock

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            down = nn.Sequential(nn.Conv2d(16, 32, 1, 2, bias=False), nn.BatchNorm2d(32))
            self.layers = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 32, 2, down), BasicBlock(32, 32))
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return ResNet()


def build(name):
    """(model, example inputs, input names, output names, dynamic axes)"""
    torch.manual_seed(0)
    if name == "mlp":
        return MLP(), (torch.randn(4, 32),), ["x"], ["y"], None
    if name == "cnn":
        m = CNN()
        randomize_bn(m)
        return m, (torch.randn(2, 3, 16, 16),), ["x"], ["y"], None
    if name == "resnet":
        m = small_resnet()
        randomize_bn(m)
        return m, (torch.randn(1, 3, 32, 32),), ["x"], ["y"], None
    if name == "mobilenetv2":
        import torchvision
        m = torchvision.models.mobilenet_v2(width_mult=0.25, num_classes=10)
        randomize_bn(m)
        return m, (torch.randn(1, 3, 32, 32),), ["x"], ["y"], None
    if name == "squeezenet":
        import torchvision
        m = torchvision.models.squeezenet1_1(num_classes=10)
        return m, (torch.randn(1, 3, 48, 48),), ["x"], ["y"], None
    if name == "vit":
        import torchvision
        m = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                 hidden_dim=32, mlp_dim=64, num_classes=10)
        nn.init.normal_(m.heads.head.weight, std=0.5)  # torchvision starts the head at zero
        return m, (torch.randn(1, 3, 32, 32),), ["x"], ["y"], None
    if name == "bert":
        from transformers import BertConfig, BertModel
        cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
        m = BertModel(cfg, add_pooling_layer=False)

        class W(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, ids, mask, types):
                return self.m(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

        ids = torch.randint(0, 100, (2, 8))
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, 6:] = 0
        types = torch.zeros(2, 8, dtype=torch.long)
        types[:, 4:] = 1
        return W(), (ids, mask, types), ["input_ids", "attention_mask", "token_type_ids"], ["last_hidden_state"], \
            {"input_ids": {1: "sequence"}, "attention_mask": {1: "sequence"}, "token_type_ids": {1: "sequence"}}
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=2, attn_implementation="eager")
        m = GPT2LMHeadModel(cfg)

        class W(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, ids):
                return self.m(input_ids=ids, use_cache=False).logits

        return W(), (torch.randint(0, 100, (1, 8)),), ["input_ids"], ["logits"], {"input_ids": {1: "sequence"}}
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          attn_implementation="eager")
        m = LlamaForCausalLM(cfg)

        class W(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, ids):
                return self.m(input_ids=ids, use_cache=False).logits

        return W(), (torch.randint(0, 100, (1, 8)),), ["input_ids"], ["logits"], {"input_ids": {1: "sequence"}}
    raise SystemExit(f"unknown model {name}")


MODELS = ["mlp", "cnn", "resnet", "mobilenetv2", "squeezenet", "vit", "bert", "gpt2", "llama"]


def export(name):
    m, args, inames, onames, dyn = build(name)
    m.eval()
    for kind, opset in (("ts", 17), ("dyn", 18)):
        path = os.path.join(OUT, f"{name}.{kind}{opset}.onnx")
        try:
            with torch.no_grad():
                if kind == "ts":
                    torch.onnx.export(m, args, path, input_names=inames, output_names=onames, opset_version=opset,
                                      dynamic_axes=dyn, dynamo=False, do_constant_folding=True)
                else:
                    ds = None
                    if dyn:
                        seq = torch.export.Dim("sequence", min=2, max=32)
                        ds = tuple({1: seq} for _ in args)
                    prog = torch.onnx.export(m, args, input_names=inames, output_names=onames, opset_version=opset,
                                             dynamic_shapes=ds, dynamo=True, external_data=False)
                    prog.save(path, external_data=False)
            print(f"{path}: {os.path.getsize(path)} bytes")
        except Exception as e:  # an exporter that cannot take the model is reported, not fatal
            print(f"{name} {kind}{opset}: export failed: {type(e).__name__}: {str(e)[:300]}")
            if os.path.exists(path):
                os.remove(path)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for n in sys.argv[1:] or MODELS:
        export(n)
