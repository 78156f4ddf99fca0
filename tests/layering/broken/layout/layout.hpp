// A layout-layer header that includes the planner: the layering check must refuse it.
#pragma once
#include "../plan/plan.hpp"
