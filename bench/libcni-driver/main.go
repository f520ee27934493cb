// libcni-driver: the benches' anchor. It runs CNI network lists through libcni itself (the
// library containerd and CRI-O link), so that nri-cni's CNI runtime and GC are compared with
// what the runtimes do, not with an imitation.
//
// One process per bench, requests as JSON lines on stdin, one JSON line answered per request
// on stdout. The time of each call is taken here, around the libcni call only: the pipe to
// the bench is not part of it.
//
//	{"op":"load","list":"real","conflist":{...}}                -> {"ok":true}
//	{"op":"add","list":"real","containerID":"..","netns":"..","ifname":"eth0",
//	 "args":[["K8S_POD_NAME","p"]],"caps":{"portMappings":[...]}} -> {"ok":true,"ns":123}
//	{"op":"del", ...the same fields as add...}                   -> {"ok":true,"ns":123}
//	{"op":"gc","list":"real","valid":[{"containerID":"..","ifname":"eth0"}]}
//	                                                              -> {"ok":true,"ns":123}
//	{"op":"cached", ...the fields of del...}   -> {"ok":true,"result":{..},"config":"<base64>"}
//	                                              (libcni's view of the cache entry, whoever wrote it)
//	{"op":"convert","result":{..},"version":"1.0.0"}             -> {"ok":true,"result":{..}}
//	                                              (a plugin's result as libcni converts it)
//	any failure                                                   -> {"ok":false,"error":".."}
//
// add also answers with the result libcni returned. The tests use the last two ops as oracles
// (tests/integration/cni/test_libcni_oracle.py).
//
// Flags: -path DIR[:DIR] (plugin dirs), -cache-dir DIR (libcni's cache, this driver's own).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
)

type request struct {
	Op          string                 `json:"op"`
	List        string                 `json:"list"`
	Conflist    json.RawMessage        `json:"conflist"`
	ContainerID string                 `json:"containerID"`
	NetNS       string                 `json:"netns"`
	IfName      string                 `json:"ifname"`
	Args        [][2]string            `json:"args"`
	Caps        map[string]interface{} `json:"caps"`
	Valid       []types.GCAttachment   `json:"valid"`
	Result      json.RawMessage        `json:"result"`
	Version     string                 `json:"version"`
}

type answer struct {
	OK     bool            `json:"ok"`
	NS     int64           `json:"ns,omitempty"`
	Error  string          `json:"error,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Config []byte          `json:"config,omitempty"`
}

func main() {
	path := flag.String("path", "/opt/cni/bin", "plugin dirs, colon-separated")
	cacheDir := flag.String("cache-dir", "", "libcni's cache dir (required: the driver's own)")
	flag.Parse()
	if *cacheDir == "" {
		fmt.Fprintln(os.Stderr, "libcni-driver: -cache-dir is required")
		os.Exit(2)
	}
	cni := libcni.NewCNIConfigWithCacheDir(strings.Split(*path, ":"), *cacheDir, nil)
	lists := map[string]*libcni.NetworkConfigList{}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var ans answer
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			ans.Error = "bad request: " + err.Error()
		} else {
			err := serve(cni, lists, &req, &ans)
			ans.OK = err == nil
			if err != nil {
				ans.Error = err.Error()
			}
		}
		if err := out.Encode(&ans); err != nil {
			os.Exit(1)
		}
	}
}

func serve(cni *libcni.CNIConfig, lists map[string]*libcni.NetworkConfigList, req *request, ans *answer) error {
	switch req.Op {
	case "load":
		list, err := libcni.ConfListFromBytes(req.Conflist)
		if err != nil {
			return err
		}
		lists[req.List] = list
		return nil
	case "convert":
		res, err := create.CreateFromBytes(req.Result)
		if err != nil {
			return err
		}
		return putResult(ans, res, req.Version)
	}
	list, ok := lists[req.List]
	if !ok {
		return fmt.Errorf("no list %q loaded", req.List)
	}
	rt := &libcni.RuntimeConf{
		ContainerID:    req.ContainerID,
		NetNS:          req.NetNS,
		IfName:         req.IfName,
		Args:           req.Args,
		CapabilityArgs: req.Caps,
	}
	if req.Op == "cached" {
		res, err := cni.GetNetworkListCachedResult(list, rt)
		if err != nil {
			return err
		}
		if ans.Config, _, err = cni.GetNetworkListCachedConfig(list, rt); err != nil {
			return err
		}
		return putResult(ans, res, "")
	}
	ctx := context.Background()
	var err error
	var res types.Result
	t0 := time.Now()
	switch req.Op {
	case "add":
		res, err = cni.AddNetworkList(ctx, list, rt)
	case "del":
		err = cni.DelNetworkList(ctx, list, rt)
	case "gc":
		err = cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: req.Valid})
	default:
		return fmt.Errorf("unknown op %q", req.Op)
	}
	ans.NS = time.Since(t0).Nanoseconds()
	if err == nil && res != nil {
		err = putResult(ans, res, "")
	}
	return err
}

// putResult sets the answer's result: res (converted to version, unless that is "") as
// encoding/json marshals it.
func putResult(ans *answer, res types.Result, version string) error {
	if res == nil {
		return nil
	}
	if version != "" {
		var err error
		if res, err = res.GetAsVersion(version); err != nil {
			return err
		}
	}
	raw, err := json.Marshal(res)
	ans.Result = raw
	return err
}
