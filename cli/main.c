/* The smelt command-line tool: the only part of smelt that talks to the
 * terminal.  Each subcommand parses its flags, calls the library, and turns a
 * status into a message on stderr and an exit code:
 *   0 success, 1 bad input or failed run, 2 bad usage. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static void print_main_help(FILE *f) {
  fputs("usage: smelt COMMAND [ARGS]\n"
        "\n"
        "smelt is a graph optimiser and fusion compiler for tensor models described in YAML.\n"
        "\n"
        "commands:\n"
        "  compile MODEL.yaml -o OUT   optimise a model and write a kernel bundle\n"
        "  run MODEL.yaml|OUT.smelt    run a model (--device ref|cpu|cuda), compare with --check\n"
        "  inspect OUT.smelt           show a bundle: IR, kernels, memory plan, sources\n"
        "  bench OUT.smelt|MODEL.yaml  time every kernel against the machine's limits\n"
        "  tune MODEL.yaml             measure kernel variants on the GPU, keep the fastest\n"
        "                              in a tuning table (--target cuda)\n"
        "  import MODEL.onnx -o Y.yaml write an ONNX model as smelt YAML plus safetensors\n"
        "                              (compile, run and bench also take MODEL.onnx directly)\n"
        "  import hf DIR -o Y.yaml     write a Hugging Face Llama-family checkpoint as smelt YAML\n"
        "                              with its KV cache (weights stay in the checkpoint's files)\n"
        "  generate MODEL|OUT.smelt    generate tokens with a causal LM and its KV-cache state\n"
        "                              (prefill, then one step per token)\n"
        "  passes                      list the passes of the default pipeline\n"
        "  ops                         list the operators and their attributes\n"
        "\n"
        "Run 'smelt COMMAND --help' for the flags of a command.\n",
        f);
}

int cli_import(int argc, char **argv); /* cli/import.c */

static int cmd_passes(int argc, char **argv) {
  if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    puts("usage: smelt passes\n\nLists every pass by its command-line name, in default pipeline order.");
    return 0;
  }
  if (argc > 1) return cli_usage("passes", "unexpected argument '%s'", argv[1]);
  char *list = strdup(pass_default_pipeline());
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    const PassInfo *p = pass_lookup(tok);
    printf("%-16s %s\n", tok, p ? p->summary : "?");
  }
  free(list);
  return 0;
}

static int cmd_ops(int argc, char **argv) {
  if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    puts("usage: smelt ops\n\nLists every operator: inputs, fusion class and attribute schema.");
    return 0;
  }
  if (argc > 1) return cli_usage("ops", "unexpected argument '%s'", argv[1]);
  for (int i = 0; i < OP_COUNT; i++) {
    const OpInfo *oi = ir_op_info((Op)i);
    char nin[32];
    if (oi->min_in == oi->max_in) snprintf(nin, sizeof nin, "%d", oi->min_in);
    else snprintf(nin, sizeof nin, "%d-%d", oi->min_in, oi->max_in);
    printf("%-16s in %-5s %-12s %s\n", oi->name, nin, ir_fusion_class_name(oi->fclass), oi->attrs);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    print_main_help(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    print_main_help(stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0) {
    puts("smelt " SMELT_VERSION);
    return 0;
  }
  if (strcmp(cmd, "compile") == 0) return cli_compile(argc - 1, argv + 1);
  if (strcmp(cmd, "run") == 0) return cli_run(argc - 1, argv + 1);
  if (strcmp(cmd, "inspect") == 0) return cli_inspect(argc - 1, argv + 1);
  if (strcmp(cmd, "bench") == 0) return cli_bench(argc - 1, argv + 1);
  if (strcmp(cmd, "tune") == 0) return cli_tune(argc - 1, argv + 1);
  if (strcmp(cmd, "import") == 0) return cli_import(argc - 1, argv + 1);
  if (strcmp(cmd, "generate") == 0) return cli_generate(argc - 1, argv + 1);
  if (strcmp(cmd, "passes") == 0) return cmd_passes(argc - 1, argv + 1);
  if (strcmp(cmd, "ops") == 0) return cmd_ops(argc - 1, argv + 1);
  static const char *const commands[] = {"compile", "run", "inspect", "bench", "tune", "import", "generate", "passes", "ops"};
  const char *near = cli_suggest_word(cmd, commands, (int)(sizeof commands / sizeof *commands));
  if (near) fprintf(stderr, "smelt: unknown command '%s' (did you mean '%s'?)\n", cmd, near);
  else fprintf(stderr, "smelt: unknown command '%s'\n", cmd);
  print_main_help(stderr);
  return 2;
}
