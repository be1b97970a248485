// The kiln umbrella header: include this one.
#pragma once

#include "kiln/autograd.h"
#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/jit.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kiln/optim.h"
#include "kiln/profiler.h"
#include "kiln/scalar.h"
#include "kiln/serialize.h"
#include "kiln/state_dict.h"
#include "kiln/tensor.h"
