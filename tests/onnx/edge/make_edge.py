#!/usr/bin/env python3
"""Writes edge_ops.onnx: ONNX ops whose decomposition must hold at the
edges (Softplus at large |x|, LessOrEqual/GreaterOrEqual with NaN, IsNaN,
IsInf), for
test_onnx_models.py's check_edge_ops.  Needs the onnx package; the file is
committed, so the test does not.

Usage: python3 make_edge.py
"""
import os

import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Softplus", ["x"], ["sp"]),
             helper.make_node("LessOrEqual", ["a", "b"], ["le"]),
             helper.make_node("GreaterOrEqual", ["a", "b"], ["ge"]),
             helper.make_node("IsNaN", ["a"], ["nan"]),
             helper.make_node("IsInf", ["c"], ["inf"]),
             helper.make_node("IsInf", ["c"], ["pinf"], detect_negative=0)]
    g = helper.make_graph(nodes, "edge_ops",
                          [helper.make_tensor_value_info("x", f, [8]), helper.make_tensor_value_info("a", f, [6]),
                           helper.make_tensor_value_info("b", f, [6]), helper.make_tensor_value_info("c", f, [5])],
                          [helper.make_tensor_value_info("sp", f, [8]),
                           helper.make_tensor_value_info("le", TensorProto.BOOL, [6]),
                           helper.make_tensor_value_info("ge", TensorProto.BOOL, [6]),
                           helper.make_tensor_value_info("nan", TensorProto.BOOL, [6]),
                           helper.make_tensor_value_info("inf", TensorProto.BOOL, [5]),
                           helper.make_tensor_value_info("pinf", TensorProto.BOOL, [5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="smelt make_edge.py")
    onnx.checker.check_model(m)
    onnx.save(m, os.path.join(HERE, "edge_ops.onnx"))


if __name__ == "__main__":
    main()
