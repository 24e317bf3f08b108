#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace shmring::torch_backend {

/// Which node each rank of a group is on: nodes in order of their lowest
/// rank, ranks of a node ascending.
struct NodeLayout {
  std::vector<std::vector<int>> nodes;  // global ranks of each node
  std::vector<int> node_of;             // node of each rank
  std::vector<int> local_of;            // index of each rank in its node
  std::vector<std::string> hosts;       // host identity of each node
  std::vector<int> pids;                // process id of each rank
  /// Every node has as many ranks.
  bool equal() const {
    return std::all_of(nodes.begin(), nodes.end(),
                       [&](const auto& n) { return n.size() == nodes[0].size(); });
  }
};

}  // namespace shmring::torch_backend
