// examples/mini_gpt/main.cpp: the mini_gpt command line. Exit status: 0 on success, 2 on bad
// input (a one-line message naming the file or flag and the problem), 1 on other failures.
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "llmc_format.hpp"
#include "trainer.hpp"

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    for (const auto& a : args) {
        if (a == "--help" || a == "-h") {
            std::cout << mini_gpt::usage_text();
            return 0;
        }
    }
    try {
        mini_gpt::options opt = mini_gpt::parse_options(args);
        mini_gpt::train(opt, std::cout);
        return 0;
    } catch (const mini_gpt::input_error& e) {
        std::cerr << "mini_gpt: error: " << e.what() << "\n";
        return 2;
    } catch (const std::invalid_argument& e) {
        std::cerr << "mini_gpt: error: " << e.what() << "\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "mini_gpt: failed: " << e.what() << "\n";
        return 1;
    }
}
