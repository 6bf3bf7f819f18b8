// mc2/models.h: reference workloads built on the fused operators: a
// decoder-only transformer trained with Megatron-style tensor + sequence
// parallelism inside a TP group and data parallelism across TP groups
// (docs/models.md has the architecture, the sharding and which fused
// operator every layer uses forward and backward).
//
//   mc2::Group world = mc2::Group::FromEnv();
//   mc2::models::TransformerConfig cfg;       // a small default model
//   cfg.fused.pipeline = mc2::Pipeline::kChunked;
//   auto stats = mc2::models::TrainSteps(world, cfg, /*tp=*/2, /*steps=*/20);
//
// Not part of <mc2/mc2.h>: link the library mc2::models (libmc2_models,
// which links libmc2) to use it.
//
// Every rank of the world makes the same calls with the same arguments
// (like a collective). Invalid configurations throw
// mc2::Error(kInvalidArgument) naming the field, on every rank, before any
// communication.
//
// This header includes one header per workload, each usable on its own:
//   <mc2/models/grid.h>            ProcessGrid, GridShape, MakeGrid, MakeGrid3D
//   <mc2/models/config.h>          TransformerConfig, StepStats, ParamView
//   <mc2/models/transformer.h>     Transformer, TrainSteps
//   <mc2/models/pipeline.h>        PipelineTransformer, TrainPipelineSteps
//   <mc2/models/inference.h>       InferenceModel (prefill + KV-cache decode)
//   <mc2/models/ring_attention.h>  RingAttention (context parallelism)
//   <mc2/models/fsdp.h>            FsdpTransformer (sharded data parallelism)
#ifndef MC2_MODELS_H_
#define MC2_MODELS_H_

#include "mc2/models/config.h"
#include "mc2/models/fsdp.h"
#include "mc2/models/grid.h"
#include "mc2/models/inference.h"
#include "mc2/models/pipeline.h"
#include "mc2/models/ring_attention.h"
#include "mc2/models/transformer.h"

#endif  // MC2_MODELS_H_
